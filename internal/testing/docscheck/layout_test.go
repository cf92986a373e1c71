package docscheck

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestInternalShowsTheProduct: `ls internal/` is the product. Every
// package directly under internal/ is part of what the commands or the
// public idem packages run (a dependency of ./cmd/... or ./idem/...), and
// the harness lives under internal/testing and internal/bench, which the
// product never imports, without exception (the services' test signals,
// free in production, are internal/lifecycle/testsignal: docs/architecture.md).
func TestInternalShowsTheProduct(t *testing.T) {
	out, err := exec.Command("go", "list", "-C", root, "-deps", "./cmd/...", "./idem/...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	const module = "github.com/idemd/idemd/"
	product := map[string]bool{}
	for _, p := range strings.Fields(string(out)) {
		if rel, ok := strings.CutPrefix(p, module); ok {
			product[rel] = true
		}
	}
	entries, err := os.ReadDir(filepath.Join(root, "internal"))
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if !e.IsDir() || e.Name() == "testing" || e.Name() == "bench" {
			continue
		}
		if !product["internal/"+e.Name()] {
			t.Errorf("internal/%s is not used by any command or by idem: harness belongs under internal/testing or internal/bench", e.Name())
		}
	}
	for p := range product {
		harness := strings.HasPrefix(p, "internal/testing/") || strings.HasPrefix(p, "internal/bench/")
		if harness {
			t.Errorf("the product imports %s, a harness package", p)
		}
	}
}
