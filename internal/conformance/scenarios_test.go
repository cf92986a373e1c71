package conformance_test

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/idemd/idemd/internal/conformance"
)

var heading = regexp.MustCompile(`(?m)^#+ (.+)$`)

// slug is the anchor GitHub gives a heading.
func slug(h string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(h) {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9', r == '-', r == '_':
			b.WriteRune(r)
		case r == ' ':
			b.WriteRune('-')
		}
	}
	return b.String()
}

// TestScenarioDocsResolve: every scenario is named once, says why in one
// line, and links a section of the docs that exists; docs/conformance.md
// describes each one.
func TestScenarioDocsResolve(t *testing.T) {
	t.Parallel()
	root := filepath.Join("..", "..")
	anchors := map[string]bool{}
	pages := map[string]string{}
	seen := map[string]bool{}
	guide, err := os.ReadFile(filepath.Join(root, "docs", "conformance.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range conformance.Scenarios() {
		if seen[s.Name] {
			t.Errorf("scenario %s twice", s.Name)
		}
		seen[s.Name] = true
		if s.Rationale == "" || strings.Contains(s.Rationale, "\n") {
			t.Errorf("%s: rationale %q is not one line", s.Name, s.Rationale)
		}
		page, _, ok := strings.Cut(s.Doc, "#")
		if !ok {
			t.Errorf("%s: doc %q has no section", s.Name, s.Doc)
			continue
		}
		if _, ok := pages[page]; !ok {
			b, err := os.ReadFile(filepath.Join(root, page))
			if err != nil {
				t.Fatal(err)
			}
			pages[page] = string(b)
			for _, m := range heading.FindAllStringSubmatch(string(b), -1) {
				anchors[page+"#"+slug(m[1])] = true
			}
		}
		if !anchors[s.Doc] {
			t.Errorf("%s: %s names no heading", s.Name, s.Doc)
		}
		if !strings.Contains(string(guide), "| `"+s.Name+"` |") {
			t.Errorf("docs/conformance.md does not describe %s", s.Name)
		}
	}
}
