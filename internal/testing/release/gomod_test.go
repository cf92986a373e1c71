package release

import (
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// TestGoLineIsTheDependenciesFloor: go.mod's go line is the highest go line
// among the modules idemd builds with, no higher. A consumer of the idem
// package is held to our go line, so a line above what the dependencies
// need would force them onto a newer Go for nothing; `go mod tidy` raises
// it when a dependency needs more, and this test then says to follow. The
// Go the project builds and tests with is the toolchain line.
func TestGoLineIsTheDependenciesFloor(t *testing.T) {
	b, err := os.ReadFile("../../../go.mod")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^go (\S+)$`).FindSubmatch(b)
	if m == nil {
		t.Fatal("go.mod has no go line")
	}
	goLine := string(m[1])
	// Every module of the build list whose go.mod Go loaded; the others
	// (pruned from the graph) constrain nothing.
	cmd := exec.Command("go", "list", "-m", "-f", "{{if not .Main}}{{.GoVersion}} {{.Path}}{{end}}", "all")
	cmd.Dir = "../../.."
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list -m all: %v", err)
	}
	floor, by := "", ""
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		v, path, ok := strings.Cut(strings.TrimSpace(line), " ")
		if !ok || v == "" {
			continue
		}
		if floor == "" || goCompare(v, floor) > 0 {
			floor, by = v, path
		}
	}
	if floor == "" {
		t.Fatalf("go list -m all named no module with a go line:\n%s", out)
	}
	if goLine != floor {
		t.Errorf("go.mod says go %s; the dependencies need go %s (%s): set `go mod edit -go=%s` and keep the toolchain line for the Go we test with", goLine, floor, by, floor)
	}
	if !regexp.MustCompile(`(?m)^toolchain go\d+\.\d+\.\d+$`).Match(b) {
		t.Error("go.mod has no toolchain line naming the Go release the project is built and tested with")
	}
}

// goCompare orders Go versions of the form 1.N or 1.N.P (1.N is below
// 1.N.0, as Go orders them).
func goCompare(a, b string) int {
	pa, pb := strings.Split(a, "."), strings.Split(b, ".")
	for i := 0; i < 3; i++ {
		x, y := -1, -1
		if i < len(pa) {
			x, _ = strconv.Atoi(pa[i])
		}
		if i < len(pb) {
			y, _ = strconv.Atoi(pb[i])
		}
		if x != y {
			if x < y {
				return -1
			}
			return 1
		}
	}
	return 0
}
