// Package testbin builds the project's commands for tests that run them as
// real processes (SIGKILL, exit codes, two processes at once). Each command
// is built once per test binary, however many tests ask for it; dbtest.Main
// removes the binaries after the tests.
package testbin

import (
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"sync"
	"testing"
)

var (
	mu    sync.Mutex
	dir   string
	built = map[string]string{} // import path -> binary
)

// Build returns the path of the binary built from the package pkg (an import
// path such as "github.com/idemd/idemd/cmd/reaper"), building it on first use.
func Build(tb testing.TB, pkg string) string {
	tb.Helper()
	mu.Lock()
	defer mu.Unlock()
	if bin, ok := built[pkg]; ok {
		return bin
	}
	if dir == "" {
		d, err := os.MkdirTemp("", "idemd-testbin-")
		if err != nil {
			tb.Fatalf("testbin: %v", err)
		}
		dir = d
	}
	bin := filepath.Join(dir, path.Base(pkg))
	if out, err := exec.Command("go", "build", "-o", bin, pkg).CombinedOutput(); err != nil {
		tb.Fatalf("testbin: go build %s: %v\n%s", pkg, err, out)
	}
	built[pkg] = bin
	return bin
}

// RemoveAll deletes every binary built so far.
func RemoveAll() {
	mu.Lock()
	defer mu.Unlock()
	if dir != "" {
		os.RemoveAll(dir) // a temp dir; nothing to do on failure
	}
	dir = ""
	built = map[string]string{}
}
