package operator

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// tablePackages own operator-facing tables: a face uses their types, but
// reads and writes them only through this package, which checks the actor,
// records the action and refuses with exit 3 in one place.
var tablePackages = map[string]bool{
	"github.com/idemd/idemd/internal/reaperpause": true,
	"github.com/idemd/idemd/internal/runhistory":  true,
	"github.com/idemd/idemd/internal/review":      true,
	"github.com/idemd/idemd/internal/lease":       true,
}

// TestFacesOwnNoQueries: idemctl (internal/ctl) and the web console
// (internal/console) are faces on this package. Neither writes SQL of its
// own nor imports pgx (pgxpool's Pool is how they hand this package the
// database), nor calls a function of a package that owns an operator-facing
// table, and the console does not reach through idemctl's commands: what
// either shows or does is one function here (docs/architecture.md).
func TestFacesOwnNoQueries(t *testing.T) {
	t.Parallel()
	sqlWords := []string{"SELECT ", "UPDATE ", "INSERT ", "DELETE FROM"}
	for _, dir := range []string{"../ctl", "../console"} {
		files, err := filepath.Glob(filepath.Join(dir, "*.go"))
		if err != nil {
			t.Fatal(err)
		}
		if len(files) == 0 {
			t.Fatalf("no Go files in %s", dir)
		}
		for _, f := range files {
			if strings.HasSuffix(f, "_test.go") {
				continue
			}
			file, err := parser.ParseFile(token.NewFileSet(), f, nil, 0)
			if err != nil {
				t.Fatal(err)
			}
			owners := map[string]string{} // the file's name for a table package -> its path
			for _, imp := range file.Imports {
				path, _ := strconv.Unquote(imp.Path.Value)
				if tablePackages[path] {
					name := filepath.Base(path)
					if imp.Name != nil {
						name = imp.Name.Name
					}
					owners[name] = path
				}
				if path == "github.com/jackc/pgx/v5" || strings.HasPrefix(path, "github.com/jackc/pgx/v5/pgconn") {
					t.Errorf("%s imports %s: a face queries through internal/operator", f, path)
				}
				if dir == "../console" && path == "github.com/idemd/idemd/internal/ctl" {
					t.Errorf("%s imports internal/ctl: the console calls internal/operator, not idemctl's commands", f)
				}
			}
			ast.Inspect(file, func(n ast.Node) bool {
				if call, ok := n.(*ast.CallExpr); ok {
					if sel, ok := call.Fun.(*ast.SelectorExpr); ok {
						if x, ok := sel.X.(*ast.Ident); ok && owners[x.Name] != "" {
							t.Errorf("%s calls %s.%s: a face reads and writes %s's table through internal/operator", f, x.Name, sel.Sel.Name, owners[x.Name])
						}
					}
				}
				lit, ok := n.(*ast.BasicLit)
				if !ok || lit.Kind != token.STRING {
					return true
				}
				s, _ := strconv.Unquote(lit.Value)
				for _, w := range sqlWords {
					if strings.Contains(strings.ToUpper(s), w) && strings.Contains(s, w) {
						t.Errorf("%s: a SQL statement (%q...): a face owns no query", f, firstLine(s))
					}
				}
				return true
			})
		}
	}
}

func firstLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return s[:i]
	}
	return s
}
