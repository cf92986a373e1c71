package docscheck

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// racePkgs are the package patterns of the Makefile's RACE_PKGS, as
// written (./internal/lease/, ./internal/reaper/...).
func racePkgs(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, "Makefile"))
	if err != nil {
		t.Fatal(err)
	}
	text := strings.ReplaceAll(string(b), "\\\n", " ")
	m := regexp.MustCompile(`(?m)^RACE_PKGS\s*:?=(.*)$`).FindStringSubmatch(text)
	if m == nil {
		t.Fatal("Makefile: no RACE_PKGS")
	}
	return strings.Fields(m[1])
}

// covers reports whether a go test pattern (./a/b/ or ./a/...) names the
// package in dir (relative to root, slash-separated).
func covers(pattern, dir string) bool {
	p := strings.TrimPrefix(pattern, "./")
	if rest, ok := strings.CutSuffix(p, "/..."); ok {
		return dir == rest || strings.HasPrefix(dir, rest+"/")
	}
	return dir == strings.TrimSuffix(p, "/")
}

// TestStressTestsRunUnderRace: docs/architecture.md ("Tests") says every
// service's TestStartStopStress runs under -race in CI. Every package that
// declares one is in the Makefile's RACE_PKGS, and .ci/run runs `make race`.
func TestStressTestsRunUnderRace(t *testing.T) {
	pkgs := racePkgs(t)
	stress := regexp.MustCompile(`(?m)^func TestStartStopStress\(`)
	found := 0
	for p, src := range goSources(t) {
		if !strings.HasSuffix(p, "_test.go") || !stress.MatchString(src) {
			continue
		}
		rel, err := filepath.Rel(root, filepath.Dir(p))
		if err != nil {
			t.Fatal(err)
		}
		dir := filepath.ToSlash(rel)
		found++
		covered := false
		for _, pat := range pkgs {
			covered = covered || covers(pat, dir)
		}
		if !covered {
			t.Errorf("%s has a TestStartStopStress but the Makefile's RACE_PKGS (%s) does not run it under -race", dir, strings.Join(pkgs, " "))
		}
	}
	if found < 4 {
		t.Fatalf("found %d TestStartStopStress, want one per service and the exporter", found)
	}
	ci, err := os.ReadFile(filepath.Join(root, ".ci", "run"))
	if err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`(?m)^[^#\n]*\bmake race\b`).Match(ci) {
		t.Error(".ci/run does not run `make race`")
	}
}

var (
	runsTable = regexp.MustCompile(`\bidemd_reaper_runs\b`)
	sqlWord   = regexp.MustCompile(`\b(SELECT|INSERT|UPDATE|DELETE|FROM|INTO|JOIN)\b`)
)

// TestRunHistoryOwnsItsTable: docs/architecture.md ("One owner per
// definition") says the reaper's run history is read and written only
// through runhistory. No product package but runhistory (and the
// migrations that create the table) has a statement naming
// idemd_reaper_runs; the harness and tests may read it as an oracle.
func TestRunHistoryOwnsItsTable(t *testing.T) {
	owners := 0
	for p, src := range goSources(t) {
		rel, err := filepath.Rel(root, p)
		if err != nil {
			t.Fatal(err)
		}
		rel = filepath.ToSlash(rel)
		if strings.HasSuffix(rel, "_test.go") || strings.HasPrefix(rel, "internal/testing/") ||
			strings.HasPrefix(rel, "internal/bench/") || strings.HasPrefix(rel, "migrations/") {
			continue
		}
		if !runsTable.MatchString(src) {
			continue
		}
		file, err := parser.ParseFile(token.NewFileSet(), p, src, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		ast.Inspect(file, func(n ast.Node) bool {
			lit, ok := n.(*ast.BasicLit)
			if !ok || lit.Kind != token.STRING {
				return true
			}
			s, err := strconv.Unquote(lit.Value)
			if err != nil || !runsTable.MatchString(s) || !sqlWord.MatchString(s) {
				return true
			}
			if strings.HasPrefix(rel, "internal/runhistory/") {
				owners++
				return true
			}
			t.Errorf("%s: a statement on idemd_reaper_runs outside runhistory: %.80q", rel, s)
			return true
		})
	}
	if owners == 0 {
		t.Fatal("runhistory has no statement on idemd_reaper_runs: the pattern is broken")
	}
}
