package docscheck

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
)

// root is the repository's top directory, seen from this package.
const root = "../../.."

// page is one documentation file, its path relative to root.
type page struct {
	path string
	text string
}

// docPages reads README.md and every docs/**/*.md.
func docPages(t *testing.T) []page {
	t.Helper()
	var pages []page
	add := func(rel string) {
		b, err := os.ReadFile(filepath.Join(root, rel))
		if err != nil {
			t.Fatalf("read %s: %v", rel, err)
		}
		pages = append(pages, page{path: rel, text: string(b)})
	}
	add("README.md")
	err := filepath.WalkDir(filepath.Join(root, "docs"), func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() && strings.HasSuffix(p, ".md") {
			rel, err := filepath.Rel(root, p)
			if err != nil {
				return err
			}
			add(filepath.ToSlash(rel))
		}
		return nil
	})
	if err != nil {
		t.Fatalf("walk docs: %v", err)
	}
	if len(pages) < 10 {
		t.Fatalf("found only %d documentation pages; is root %q the repository?", len(pages), root)
	}
	return pages
}

// benchmarksDir is the one place for measurement history.
const benchmarksDir = "docs/benchmarks/"

var (
	// A calendar date, unless it is the date of an RFC 3339 timestamp
	// (2026-12-03T12:40:00Z), which the pages use in sample output.
	datedRun = regexp.MustCompile(`\b\d{4}-\d{2}-\d{2}\b(?:[^T]|$)`)
	// "issue 19", "issues 14 and 16", "#19".
	issueRef = regexp.MustCompile(`(?i)\bissues? #?\d+|(?:^|[\s(\[])#\d+\b`)
	// Who measured when: "this session", "the previous session's run".
	sessionTalk = regexp.MustCompile(`(?i)\b(?:previous|last|earlier|second|third|fourth|another) session\b|\bthis session[,;)]`)
)

// TestGuidesCarryNoLabNotebook: outside docs/benchmarks/ the pages say
// what is true now; dated runs, issue numbers and session talk are
// history and live in the benchmarks' history files.
func TestGuidesCarryNoLabNotebook(t *testing.T) {
	checked := 0
	for _, p := range docPages(t) {
		if strings.HasPrefix(p.path, benchmarksDir) {
			continue
		}
		checked++
		for i, line := range strings.Split(p.text, "\n") {
			for _, c := range []struct {
				what string
				re   *regexp.Regexp
			}{{"dated run", datedRun}, {"issue number", issueRef}, {"session talk", sessionTalk}} {
				if m := c.re.FindString(line); m != "" {
					t.Errorf("%s:%d: %s %q: move the history to %s and say what is true now", p.path, i+1, c.what, strings.TrimSpace(m), benchmarksDir)
				}
			}
		}
	}
	if checked == 0 {
		t.Fatal("no guide checked")
	}
}

// TestLabNotebookPatterns keeps the patterns above honest: each catches
// what it is for and lets sample output through.
func TestLabNotebookPatterns(t *testing.T) {
	for _, c := range []struct {
		re   *regexp.Regexp
		line string
		want bool
	}{
		{datedRun, "One full run, 2026-12-03, on two cores", true},
		{datedRun, "three runs, 2026-12-03/04", true},
		{datedRun, "until 2026-12-04", true},
		{datedRun, "status at 2026-12-02T12:40:00Z", false},
		{issueRef, "Until issue 16 every batch", true},
		{issueRef, "(issue 19)", true},
		{issueRef, "see #19 for", true},
		{issueRef, "[degraded modes](#signs-of-a-degraded-mode)", false},
		{issueRef, "# a shell comment", false},
		{sessionTalk, "Run 4 (this session, after", true},
		{sessionTalk, "a session advisory lock", false},
		{sessionTalk, "(third session, 2026-12-03)", true},
		{sessionTalk, "On the previous session's machine", true},
		{sessionTalk, "LISTEN already needs this session connection", false},
		{sessionTalk, "with both on one session the drainer", false},
	} {
		if got := c.re.MatchString(c.line); got != c.want {
			t.Errorf("%v on %q: matched %v, want %v", c.re, c.line, got, c.want)
		}
	}
}

// sortedKeys is for stable failure messages.
func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
