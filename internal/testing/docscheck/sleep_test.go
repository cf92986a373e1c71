package docscheck

import (
	"go/ast"
	"go/parser"
	"go/token"
	"strings"
	"testing"
)

// Tests never sleep to wait for work (docs/architecture.md, "Tests"): a
// time.Sleep in a test is either the pause between two tries of a poll
// whose loop fails at a deadline (it compares time.Now() with one), or a
// random pause that makes a fault land anywhere (its duration is drawn
// from rand). Anything else is a wait for work by guesswork.
func TestTestsNeverSleepToWaitForWork(t *testing.T) {
	sleeps := 0
	for path, src := range goSources(t) {
		if !strings.HasSuffix(path, "_test.go") {
			continue
		}
		fset := token.NewFileSet()
		file, err := parser.ParseFile(fset, path, src, 0)
		if err != nil {
			t.Fatal(err)
		}
		var stack []ast.Node
		ast.Inspect(file, func(n ast.Node) bool {
			if n == nil {
				stack = stack[:len(stack)-1]
				return true
			}
			stack = append(stack, n)
			call, ok := n.(*ast.CallExpr)
			if !ok || !isSel(call.Fun, "time", "Sleep") {
				return true
			}
			sleeps++
			if random(call.Args[0], stack) || inDeadlineLoop(stack) {
				return true
			}
			t.Errorf("%s: time.Sleep neither polls to a deadline nor draws a random pause: wait on a signal or poll with testwait.Until", fset.Position(call.Pos()))
			return true
		})
	}
	if sleeps == 0 {
		t.Fatal("no time.Sleep found at all: the walk looked in the wrong place")
	}
}

func isSel(e ast.Expr, pkg, name string) bool {
	sel, ok := e.(*ast.SelectorExpr)
	if !ok {
		return false
	}
	x, ok := sel.X.(*ast.Ident)
	return ok && x.Name == pkg && sel.Sel.Name == name
}

// random reports whether a sleep's duration is drawn from rand: the
// expression names it, or is a variable the enclosing function assigns
// from an expression that does.
func random(arg ast.Expr, stack []ast.Node) bool {
	if mentions(arg, "rand", "rng") {
		return true
	}
	id, ok := arg.(*ast.Ident)
	if !ok {
		return false
	}
	for i := len(stack) - 1; i >= 0; i-- {
		var body *ast.BlockStmt
		switch fn := stack[i].(type) {
		case *ast.FuncDecl:
			body = fn.Body
		case *ast.FuncLit:
			body = fn.Body
		default:
			continue
		}
		drawn := false
		ast.Inspect(body, func(n ast.Node) bool {
			as, ok := n.(*ast.AssignStmt)
			if !ok {
				return !drawn
			}
			for j, l := range as.Lhs {
				if lid, ok := l.(*ast.Ident); ok && lid.Name == id.Name && j < len(as.Rhs) && mentions(as.Rhs[j], "rand", "rng") {
					drawn = true
				}
			}
			return !drawn
		})
		return drawn
	}
	return false
}

// mentions reports whether e names any of the identifiers.
func mentions(e ast.Node, names ...string) bool {
	found := false
	ast.Inspect(e, func(n ast.Node) bool {
		if id, ok := n.(*ast.Ident); ok {
			for _, name := range names {
				if id.Name == name {
					found = true
				}
			}
		}
		return !found
	})
	return found
}

// inDeadlineLoop reports whether the innermost loop around the sleep
// compares time.Now() with a deadline (time.Now().After(...), or
// time.Since/time.Until) in its body or condition.
func inDeadlineLoop(stack []ast.Node) bool {
	for i := len(stack) - 1; i >= 0; i-- {
		loop, ok := stack[i].(*ast.ForStmt)
		if !ok {
			continue
		}
		deadline := false
		ast.Inspect(loop, func(n ast.Node) bool {
			call, ok := n.(*ast.CallExpr)
			if !ok {
				return !deadline
			}
			if sel, ok := call.Fun.(*ast.SelectorExpr); ok && (sel.Sel.Name == "After" || sel.Sel.Name == "Before") {
				if inner, ok := sel.X.(*ast.CallExpr); ok && isSel(inner.Fun, "time", "Now") {
					deadline = true
				}
			}
			if isSel(call.Fun, "time", "Since") || isSel(call.Fun, "time", "Until") {
				deadline = true
			}
			return !deadline
		})
		return deadline
	}
	return false
}
