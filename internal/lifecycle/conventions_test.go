package lifecycle

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"strings"
	"testing"
)

// services are the packages built on the Skeleton (docs/architecture.md).
var services = []string{"enqueuer", "completer", "reaper", "dbstats"}

// Every service is built on the Skeleton, and none keeps loop bookkeeping
// of its own: no Runner, no ticker, no Loop run by hand (side loops go
// through Skeleton.Beside or Beside).
func TestServicesAreBuiltOnTheSkeleton(t *testing.T) {
	for _, svc := range services {
		files, err := filepath.Glob(filepath.Join("..", svc, "*.go"))
		if err != nil {
			t.Fatal(err)
		}
		skeleton := false
		for _, f := range files {
			if strings.HasSuffix(f, "_test.go") {
				continue
			}
			file, err := parser.ParseFile(token.NewFileSet(), f, nil, 0)
			if err != nil {
				t.Fatal(err)
			}
			ast.Inspect(file, func(n ast.Node) bool {
				switch n := n.(type) {
				case *ast.SelectorExpr:
					x, ok := n.X.(*ast.Ident)
					if !ok {
						return true
					}
					switch x.Name + "." + n.Sel.Name {
					case "lifecycle.Skeleton":
						skeleton = true
					case "lifecycle.Runner":
						t.Errorf("%s: a Runner of its own; the Skeleton owns the service's", f)
					case "time.NewTicker", "time.Tick":
						t.Errorf("%s: a ticker; a loop is a lifecycle.Loop run by the Skeleton or Beside", f)
					}
				case *ast.CallExpr:
					// lifecycle.Loop{...}.Run(...)
					if sel, ok := n.Fun.(*ast.SelectorExpr); ok && sel.Sel.Name == "Run" {
						if lit, ok := sel.X.(*ast.CompositeLit); ok {
							if ts, ok := lit.Type.(*ast.SelectorExpr); ok && ts.Sel.Name == "Loop" {
								t.Errorf("%s: a Loop run by hand; give it to the Skeleton (Beside) or lifecycle.Beside", f)
							}
						}
					}
				}
				return true
			})
		}
		if !skeleton {
			t.Errorf("%s: not built on lifecycle.Skeleton", svc)
		}
	}
}

// Every service embeds the Skeleton (as River's services embed
// BaseStartStop), so its Start, Stop and RunOnce are the Skeleton's and
// mean the same for all: no service declares them itself.
func TestServicesEmbedTheSkeleton(t *testing.T) {
	for _, svc := range services {
		files, err := filepath.Glob(filepath.Join("..", svc, "*.go"))
		if err != nil {
			t.Fatal(err)
		}
		embeds := false
		for _, f := range files {
			if strings.HasSuffix(f, "_test.go") {
				continue
			}
			file, err := parser.ParseFile(token.NewFileSet(), f, nil, 0)
			if err != nil {
				t.Fatal(err)
			}
			for _, d := range file.Decls {
				switch d := d.(type) {
				case *ast.GenDecl:
					for _, spec := range d.Specs {
						ts, ok := spec.(*ast.TypeSpec)
						if !ok || ts.Name.Name != "Service" {
							continue
						}
						st, ok := ts.Type.(*ast.StructType)
						if !ok {
							continue
						}
						for _, field := range st.Fields.List {
							if len(field.Names) == 0 && isSkeleton(field.Type) {
								embeds = true
							}
						}
					}
				case *ast.FuncDecl:
					if d.Recv == nil || len(d.Recv.List) != 1 {
						continue
					}
					recv := d.Recv.List[0].Type
					if star, ok := recv.(*ast.StarExpr); ok {
						recv = star.X
					}
					if id, ok := recv.(*ast.Ident); ok && id.Name == "Service" {
						switch d.Name.Name {
						case "Start", "Stop", "RunOnce", "runOnce":
							t.Errorf("%s: Service declares %s; it is the embedded Skeleton's", f, d.Name.Name)
						}
					}
				}
			}
		}
		if !embeds {
			t.Errorf("%s: Service does not embed lifecycle.Skeleton", svc)
		}
	}
}

// isSkeleton reports whether a field's type is lifecycle.Skeleton[...].
func isSkeleton(e ast.Expr) bool {
	idx, ok := e.(*ast.IndexExpr)
	if !ok {
		return false
	}
	sel, ok := idx.X.(*ast.SelectorExpr)
	if !ok {
		return false
	}
	x, ok := sel.X.(*ast.Ident)
	return ok && x.Name == "lifecycle" && sel.Sel.Name == "Skeleton"
}

// A batch never sees the pass's Result (docs/architecture.md): runBatch,
// and every function of the service it calls, takes no *Result; the pass
// adds what a batch returns in one place. (The completer's runBatch
// returns a Result of its own, for one batch, which the pass adds.)
func TestBatchesNeverSeeThePassResult(t *testing.T) {
	for _, svc := range services {
		files, err := filepath.Glob(filepath.Join("..", svc, "*.go"))
		if err != nil {
			t.Fatal(err)
		}
		funcs := map[string]*ast.FuncDecl{} // the package's functions and Service's methods, by name
		for _, f := range files {
			if strings.HasSuffix(f, "_test.go") {
				continue
			}
			file, err := parser.ParseFile(token.NewFileSet(), f, nil, 0)
			if err != nil {
				t.Fatal(err)
			}
			for _, d := range file.Decls {
				if fn, ok := d.(*ast.FuncDecl); ok && (fn.Recv == nil || receiverIs(fn, "Service")) {
					funcs[fn.Name.Name] = fn
				}
			}
		}
		if funcs["runBatch"] == nil {
			continue // dbstats: a pass of one unit, no batches
		}
		seen := map[string]bool{}
		var visit func(name string)
		visit = func(name string) {
			fn := funcs[name]
			if fn == nil || seen[name] {
				return
			}
			seen[name] = true
			for _, p := range fn.Type.Params.List {
				if star, ok := p.Type.(*ast.StarExpr); ok {
					if id, ok := star.X.(*ast.Ident); ok && id.Name == "Result" {
						t.Errorf("%s: %s, below runBatch, takes the pass's *Result", svc, name)
					}
				}
			}
			ast.Inspect(fn.Body, func(n ast.Node) bool {
				call, ok := n.(*ast.CallExpr)
				if !ok {
					return true
				}
				switch f := call.Fun.(type) {
				case *ast.Ident:
					visit(f.Name)
				case *ast.SelectorExpr:
					if x, ok := f.X.(*ast.Ident); ok && x.Name == "s" {
						visit(f.Sel.Name)
					}
				}
				return true
			})
		}
		visit("runBatch")
		if len(seen) < 2 {
			t.Errorf("%s: runBatch calls nothing of the service: the check would see nothing", svc)
		}
	}
}

func receiverIs(fn *ast.FuncDecl, name string) bool {
	if len(fn.Recv.List) != 1 {
		return false
	}
	typ := fn.Recv.List[0].Type
	if star, ok := typ.(*ast.StarExpr); ok {
		typ = star.X
	}
	id, ok := typ.(*ast.Ident)
	return ok && id.Name == name
}

// Every service creates its collectors in metrics.go with
// newMetrics(reg prometheus.Registerer) (*metrics, error), and has a
// TestStartStopStress (docs/architecture.md).
func TestServicesHaveMetricsAndAStressTest(t *testing.T) {
	for _, svc := range services {
		metrics, err := parser.ParseFile(token.NewFileSet(), filepath.Join("..", svc, "metrics.go"), nil, 0)
		if err != nil {
			t.Errorf("%s: metrics.go: %v", svc, err)
			continue
		}
		ok := false
		for _, d := range metrics.Decls {
			fn, isFn := d.(*ast.FuncDecl)
			if !isFn || fn.Recv != nil || fn.Name.Name != "newMetrics" || len(fn.Type.Params.List) != 1 || fn.Type.Results == nil || len(fn.Type.Results.List) != 2 {
				continue
			}
			param, _ := fn.Type.Params.List[0].Type.(*ast.SelectorExpr)
			res, _ := fn.Type.Results.List[0].Type.(*ast.StarExpr)
			errType, _ := fn.Type.Results.List[1].Type.(*ast.Ident)
			if param != nil && param.Sel.Name == "Registerer" && res != nil && errType != nil && errType.Name == "error" {
				if id, isID := res.X.(*ast.Ident); isID && id.Name == "metrics" {
					ok = true
				}
			}
		}
		if !ok {
			t.Errorf("%s: metrics.go has no newMetrics(reg prometheus.Registerer) (*metrics, error)", svc)
		}

		tests, err := filepath.Glob(filepath.Join("..", svc, "*_test.go"))
		if err != nil {
			t.Fatal(err)
		}
		stress := false
		for _, f := range tests {
			file, err := parser.ParseFile(token.NewFileSet(), f, nil, 0)
			if err != nil {
				t.Fatal(err)
			}
			for _, d := range file.Decls {
				if fn, isFn := d.(*ast.FuncDecl); isFn && fn.Recv == nil && fn.Name.Name == "TestStartStopStress" {
					stress = true
				}
			}
		}
		if !stress {
			t.Errorf("%s: no TestStartStopStress", svc)
		}
	}
}

// The services use the shared pieces, never each other
// (docs/architecture.md, "Packages").
func TestServicesNeverImportEachOther(t *testing.T) {
	daemons := []string{"enqueuer", "completer", "reaper"}
	for _, svc := range daemons {
		files, err := filepath.Glob(filepath.Join("..", svc, "*.go"))
		if err != nil || len(files) == 0 {
			t.Fatalf("%s: no files (%v)", svc, err)
		}
		for _, f := range files {
			if strings.HasSuffix(f, "_test.go") {
				continue
			}
			file, err := parser.ParseFile(token.NewFileSet(), f, nil, parser.ImportsOnly)
			if err != nil {
				t.Fatal(err)
			}
			for _, imp := range file.Imports {
				for _, other := range daemons {
					if other != svc && strings.Trim(imp.Path.Value, `"`) == "github.com/idemd/idemd/internal/"+other {
						t.Errorf("%s imports internal/%s: services share pieces, never each other", f, other)
					}
				}
			}
		}
	}
}
