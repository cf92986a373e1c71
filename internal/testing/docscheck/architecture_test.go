package docscheck

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

var (
	// `pkg.Name` or `pkg.Name(...)`/`pkg.Name[T]` in code spans.
	archQualified = regexp.MustCompile("`([a-z][a-z0-9]*)\\.([A-Za-z_][A-Za-z0-9_]*)")
	// internal/... and cmd/... paths the page names.
	archPath      = regexp.MustCompile(`\b(?:internal|cmd)/[A-Za-z0-9_./-]*[A-Za-z0-9_]`)
	archShortPath = regexp.MustCompile("`([a-z]+/[a-z_]+\\.go)`")
	archTest      = regexp.MustCompile(`\bTest[A-Z][A-Za-z0-9]*`)
	testFunc      = regexp.MustCompile(`(?m)^func (Test[A-Z][A-Za-z0-9]*)\(`)
)

// testSources are the repository's _test.go files' contents.
func testSources(t *testing.T) []string {
	t.Helper()
	var out []string
	for p, src := range goSources(t) {
		if strings.HasSuffix(p, "_test.go") {
			out = append(out, src)
		}
	}
	return out
}

// TestArchitectureNamesExist: docs/architecture.md is a list of claims
// about the code, and the names it gives as evidence must exist. Every
// path under internal/ or cmd/ it names is in the tree, and every
// `pkg.Name` whose pkg is an internal package is declared in that package
// (a function, type, variable or constant; Name may also be a method or
// field of one of its types).
func TestArchitectureNamesExist(t *testing.T) {
	page, err := os.ReadFile(filepath.Join(root, "docs", "architecture.md"))
	if err != nil {
		t.Fatal(err)
	}
	text := string(page)

	paths := 0
	for _, loc := range archPath.FindAllStringIndex(text, -1) {
		if strings.HasSuffix(text[:loc[0]], "River's `") {
			continue // River's own tree, the model the page cites
		}
		p := strings.TrimSuffix(strings.TrimSuffix(text[loc[0]:loc[1]], "/..."), "/")
		if strings.Contains(p, "<") || strings.HasSuffix(p, "/<service>") {
			continue
		}
		paths++
		if _, err := os.Stat(filepath.Join(root, p)); err != nil {
			t.Errorf("docs/architecture.md names %s, which is not in the tree", p)
		}
	}

	// Short paths (`enqueuer/backlog.go`) are under internal/.
	for _, m := range archShortPath.FindAllStringSubmatch(text, -1) {
		paths++
		if _, err := os.Stat(filepath.Join(root, "internal", m[1])); err != nil {
			t.Errorf("docs/architecture.md names %s, which is not internal/%s", m[1], m[1])
		}
	}

	pkgs := internalPackages(t)
	checked := 0
	for _, m := range archQualified.FindAllStringSubmatch(text, -1) {
		dirs, ok := pkgs[m[1]]
		if !ok {
			continue // not a package: a variable (res.add, stop.Requested), a type's method
		}
		checked++
		if !declaresAny(t, dirs, m[2]) {
			t.Errorf("docs/architecture.md names %s.%s, which package %s does not declare", m[1], m[2], m[1])
		}
	}
	// Every test the page cites as a rule's check exists.
	tests := map[string]bool{}
	for _, src := range testSources(t) {
		for _, m := range testFunc.FindAllStringSubmatch(src, -1) {
			tests[m[1]] = true
		}
	}
	cited := archTest.FindAllString(text, -1)
	for _, name := range cited {
		if !tests[name] {
			t.Errorf("docs/architecture.md cites %s, which no test file declares", name)
		}
	}
	if paths < 10 || checked < 10 || len(cited) < 5 {
		t.Fatalf("checked %d paths and %d qualified names: the patterns are broken", paths, checked)
	}
}

// internalPackages maps a package's name to its directories under
// internal/ (two levels deep: lifecycle/testsignal is testsignal).
func internalPackages(t *testing.T) map[string][]string {
	t.Helper()
	out := map[string][]string{}
	for _, pattern := range []string{"internal/*", "internal/*/*"} {
		dirs, err := filepath.Glob(filepath.Join(root, pattern))
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range dirs {
			if st, err := os.Stat(d); err == nil && st.IsDir() {
				out[filepath.Base(d)] = append(out[filepath.Base(d)], d)
			}
		}
	}
	return out
}

// declaresAny reports whether a non-test file in any of dirs declares name
// at top level, or as a method or a struct field.
func declaresAny(t *testing.T, dirs []string, name string) bool {
	t.Helper()
	for _, dir := range dirs {
		files, err := filepath.Glob(filepath.Join(dir, "*.go"))
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range files {
			if strings.HasSuffix(f, "_test.go") {
				continue
			}
			file, err := parser.ParseFile(token.NewFileSet(), f, nil, parser.SkipObjectResolution)
			if err != nil {
				t.Fatal(err)
			}
			found := false
			ast.Inspect(file, func(n ast.Node) bool {
				switch n := n.(type) {
				case *ast.FuncDecl:
					found = found || n.Name.Name == name
				case *ast.TypeSpec:
					found = found || n.Name.Name == name
				case *ast.ValueSpec:
					for _, id := range n.Names {
						found = found || id.Name == name
					}
				case *ast.Field:
					for _, id := range n.Names {
						found = found || id.Name == name
					}
				}
				return !found
			})
			if found {
				return true
			}
		}
	}
	return false
}

// TestCommandsAreThinAndNoUtils: each cmd/<name>/main.go's main is one
// statement, os.Exit of the command's Main (docs/architecture.md,
// "Packages"), and no package anywhere is a grab bag named utils, util,
// helpers, common or misc.
func TestCommandsAreThinAndNoUtils(t *testing.T) {
	mains, err := filepath.Glob(filepath.Join(root, "cmd", "*", "main.go"))
	if err != nil || len(mains) < 4 {
		t.Fatalf("cmd/*/main.go: %d found, %v", len(mains), err)
	}
	for _, f := range mains {
		file, err := parser.ParseFile(token.NewFileSet(), f, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		thin := false
		for _, d := range file.Decls {
			fn, ok := d.(*ast.FuncDecl)
			if !ok || fn.Name.Name != "main" || len(fn.Body.List) != 1 {
				continue
			}
			if es, ok := fn.Body.List[0].(*ast.ExprStmt); ok {
				if call, ok := es.X.(*ast.CallExpr); ok && isSel(call.Fun, "os", "Exit") && len(call.Args) == 1 {
					if inner, ok := call.Args[0].(*ast.CallExpr); ok {
						sel, ok := inner.Fun.(*ast.SelectorExpr)
						thin = ok && sel.Sel.Name == "Main"
					}
				}
			}
		}
		if !thin {
			t.Errorf("%s: main is not the one line os.Exit(<pkg>.Main(...)); put the rest in internal/", f)
		}
	}

	grabBags := map[string]bool{"utils": true, "util": true, "helpers": true, "common": true, "misc": true}
	for p, src := range goSources(t) {
		file, err := parser.ParseFile(token.NewFileSet(), p, src, parser.PackageClauseOnly)
		if err != nil {
			t.Fatal(err)
		}
		if grabBags[file.Name.Name] {
			t.Errorf("%s: package %s; name a package after what it does", p, file.Name.Name)
		}
	}
}
