package docscheck

import (
	"os"
	"path"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

var (
	mdLink  = regexp.MustCompile(`\]\(([^)\s]+)\)`)
	heading = regexp.MustCompile(`(?m)^#{1,6} (.+)$`)
	fence   = regexp.MustCompile("(?ms)^```.*?^```")
)

// slug is GitHub's anchor for a heading: lower case, punctuation other
// than '-' and '_' dropped, spaces to '-'.
func slug(h string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(strings.TrimSpace(h)) {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-' || r == '_' || r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r > 127:
			b.WriteRune(r)
		}
	}
	return b.String()
}

// anchors are the heading anchors of a markdown text (code blocks, whose
// '#' lines are comments, left out).
func anchors(text string) map[string]bool {
	out := map[string]bool{}
	for _, m := range heading.FindAllStringSubmatch(fence.ReplaceAllString(text, ""), -1) {
		out[slug(m[1])] = true
	}
	return out
}

// TestDocLinksResolve: every relative link of README.md and docs/ names a
// file of the tree, and a #fragment names a heading of its page, so moving
// a section cannot leave a link behind.
func TestDocLinksResolve(t *testing.T) {
	pages := docPages(t)
	texts := map[string]string{}
	for _, p := range pages {
		texts[p.path] = p.text
	}
	checked := 0
	for _, p := range pages {
		for _, m := range mdLink.FindAllStringSubmatch(fence.ReplaceAllString(p.text, ""), -1) {
			target := m[1]
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			file, frag, _ := strings.Cut(target, "#")
			rel := p.path
			if file != "" {
				rel = path.Clean(path.Join(path.Dir(p.path), file))
				if _, err := os.Stat(filepath.Join(root, filepath.FromSlash(rel))); err != nil {
					t.Errorf("%s: link %q: %s does not exist", p.path, target, rel)
					continue
				}
			}
			checked++
			if frag == "" || !strings.HasSuffix(rel, ".md") {
				continue
			}
			text, ok := texts[rel]
			if !ok {
				b, err := os.ReadFile(filepath.Join(root, filepath.FromSlash(rel)))
				if err != nil {
					t.Errorf("%s: link %q: %v", p.path, target, err)
					continue
				}
				text = string(b)
			}
			if !anchors(text)[frag] {
				t.Errorf("%s: link %q: %s has no heading #%s", p.path, target, rel, frag)
			}
		}
	}
	if checked < 20 {
		t.Fatalf("only %d links checked: the pattern is broken", checked)
	}
}

func TestSlug(t *testing.T) {
	for h, want := range map[string]string{
		"Connection poolers and managed PostgreSQL":        "connection-poolers-and-managed-postgresql",
		"Run history: is the CronJob healthy?":             "run-history-is-the-cronjob-healthy",
		"`idemctl review resolve ID --note TEXT --by WHO`": "idemctl-review-resolve-id---note-text---by-who",
		"Coalesced wake-ups (issue 19)":                    "coalesced-wake-ups-issue-19",
	} {
		if got := slug(h); got != want {
			t.Errorf("slug(%q) = %q, want %q", h, got, want)
		}
	}
}

// TestDesignLayoutNamesTheTopLevel: docs/design.md's "Layout" block names
// every entry at the top of the tree, so a new top-level directory is a
// design change made on purpose.
func TestDesignLayoutNamesTheTopLevel(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(root, "docs", "design.md"))
	if err != nil {
		t.Fatal(err)
	}
	text := string(b)
	start := strings.Index(text, "## Layout")
	if start < 0 {
		t.Fatal("docs/design.md has no Layout section")
	}
	block := fence.FindString(text[start:])
	if block == "" {
		t.Fatal("docs/design.md's Layout section has no code block")
	}
	words := map[string]bool{}
	for _, w := range strings.Fields(block) {
		words[strings.TrimSuffix(strings.SplitN(w, "/", 2)[0], "/")] = true
	}
	entries, err := os.ReadDir(root)
	if err != nil {
		t.Fatal(err)
	}
	// Build outputs (make build, make bench, make soak, make
	// release-snapshot) and the repository's own metadata are not the
	// layout.
	ignored := map[string]bool{".git": true, "bin": true, "bench-report.txt": true, "soak-report.txt": true, "soak-samples.csv": true, "dist": true, "build": true}
	named := 0
	for _, e := range entries {
		if ignored[e.Name()] || strings.HasSuffix(e.Name(), ".test") || strings.HasSuffix(e.Name(), ".out") {
			continue
		}
		if !words[e.Name()] {
			t.Errorf("docs/design.md's Layout does not name the top-level %q", e.Name())
		}
		named++
	}
	if named < 10 {
		t.Fatalf("only %d top-level entries seen: is root the repository?", named)
	}
}
