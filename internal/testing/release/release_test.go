package release

import (
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
)

func TestParse(t *testing.T) {
	const a, b = "dd2a8bd9bf027656a2827f0b0703c165978eeddc", "0123456789abcdef0123456789abcdef01234567"
	got, err := Parse("# Changelog\n\n[Unreleased]: https://github.com/idemd/idemd/compare/" + b + "...main\n" +
		"[0.10.0]: https://github.com/idemd/idemd/tree/" + b + "\n[0.9.1]: https://github.com/idemd/idemd/tree/" + a + "\n")
	if err != nil || len(got) != 2 || got[0] != (Release{"0.10.0", b}) || got[1] != (Release{"0.9.1", a}) {
		t.Errorf("Parse = %v, %v", got, err)
	}
	for name, text := range map[string]string{
		"oldest first": "[0.1.0]: https://github.com/idemd/idemd/tree/" + a + "\n[0.2.0]: https://github.com/idemd/idemd/tree/" + b + "\n",
		"twice":        "[0.1.0]: https://github.com/idemd/idemd/tree/" + a + "\n[0.1.0]: https://github.com/idemd/idemd/tree/" + b + "\n",
		"none":         "[0.1.0]: https://github.com/idemd/idemd/releases/tag/v0.1.0\n",
	} {
		if got, err := Parse(text); err == nil {
			t.Errorf("%s: Parse = %v, want an error", name, got)
		}
	}
}

// TestChangelogRecord: the real CHANGELOG.md records every release it has a
// section for, each at a commit of this repository, and the release being
// prepared (VERSION) is newer than all of them and not yet recorded.
func TestChangelogRecord(t *testing.T) {
	text, err := ReadChangelog(".")
	if err != nil {
		t.Fatal(err)
	}
	rs, err := Parse(text)
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile("../../../VERSION")
	if err != nil {
		t.Fatal(err)
	}
	version := strings.TrimSpace(string(b))
	if Compare(version, rs[0].Version) <= 0 {
		t.Errorf("VERSION %s is not newer than the latest recorded release %s: bump VERSION after a release", version, rs[0].Version)
	}
	if !regexp.MustCompile(`(?m)^## \[Unreleased\] — ` + regexp.QuoteMeta(version) + `$`).MatchString(text) {
		t.Errorf("CHANGELOG.md has no \"## [Unreleased] — %s\" section for the release being prepared", version)
	}
	sections := regexp.MustCompile(`(?m)^## \[(\d+\.\d+\.\d+)\] — \d{4}-\d{2}-\d{2}$`).FindAllStringSubmatch(text, -1)
	recorded := map[string]bool{}
	for _, r := range rs {
		recorded[r.Version] = true
	}
	if len(sections) != len(rs) {
		t.Errorf("CHANGELOG.md has %d release sections and records %d releases", len(sections), len(rs))
	}
	for _, s := range sections {
		if !recorded[s[1]] {
			t.Errorf("release %s has a section but no line in the link table", s[1])
		}
	}
	if want := "[Unreleased]: https://github.com/idemd/idemd/compare/" + rs[0].Commit + "...main\n"; !strings.Contains(text, want) {
		t.Errorf("the link table lacks %q: what is unreleased is compared with the latest release", want)
	}
	if rs[len(rs)-1] != (Release{"0.1.0", "dd2a8bd9bf027656a2827f0b0703c165978eeddc"}) {
		t.Errorf("the first release is %v, want 0.1.0 at dd2a8bd", rs[len(rs)-1])
	}
	for _, r := range rs {
		out, err := exec.Command("git", "cat-file", "-e", r.Commit+"^{commit}").CombinedOutput()
		if err != nil {
			msg := "release " + r.Version + "'s commit " + r.Commit + " is not in this clone (" + strings.TrimSpace(string(out)) + "): fetch the full history"
			if os.Getenv("CI") == "true" {
				t.Error(msg)
			} else {
				t.Log(msg)
			}
		}
	}
}

func TestCompare(t *testing.T) {
	for _, c := range []struct {
		a, b string
		want int
	}{{"0.2.0", "0.1.0", 1}, {"0.10.0", "0.9.9", 1}, {"1.0.0", "1.0.0", 0}, {"0.1.9", "0.2.0", -1}} {
		if got := Compare(c.a, c.b); got != c.want {
			t.Errorf("Compare(%s, %s) = %d, want %d", c.a, c.b, got, c.want)
		}
	}
}
