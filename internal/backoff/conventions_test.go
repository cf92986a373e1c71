package backoff

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// handWritten finds a retry delay computed from an attempt number by hand
// (time.Duration(attempt)*200*time.Millisecond, attempt*time.Second): the
// delays that docs/architecture.md gives to this package.
var handWritten = regexp.MustCompile(`time\.Duration\(\s*attempts?\w*\s*\)\s*\*|\battempts?\w*\s*\*\s*time\.`)

// TestRetryDelaysAreBackoffs: no product code outside this package
// computes a retry delay from an attempt number; it calls Delay.
func TestRetryDelaysAreBackoffs(t *testing.T) {
	root := filepath.Join("..", "..")
	checked := 0
	for _, dir := range []string{"internal", "cmd", "idem"} {
		err := filepath.WalkDir(filepath.Join(root, dir), func(path string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if d.IsDir() && (d.Name() == "testing" || d.Name() == "bench" || d.Name() == "backoff") {
				return filepath.SkipDir
			}
			if d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
				return nil
			}
			b, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			checked++
			for i, line := range strings.Split(string(b), "\n") {
				if handWritten.MatchString(line) {
					t.Errorf("%s:%d: a retry delay written by hand (use backoff.Delay): %s", path, i+1, strings.TrimSpace(line))
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	if checked < 100 {
		t.Fatalf("checked %d files: the walk did not find the product", checked)
	}
}
