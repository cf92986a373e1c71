package buildinfo

import (
	"os"
	"regexp"
	"runtime/debug"
	"strings"
	"testing"
)

func TestVCSCommit(t *testing.T) {
	const rev = "0123456789abcdef0123456789abcdef01234567"
	for _, tc := range []struct {
		name     string
		settings []debug.BuildSetting
		want     string
	}{
		{"clean tree", []debug.BuildSetting{{Key: "vcs", Value: "git"}, {Key: "vcs.revision", Value: rev}, {Key: "vcs.modified", Value: "false"}}, "0123456"},
		{"dirty tree", []debug.BuildSetting{{Key: "vcs.revision", Value: rev}, {Key: "vcs.modified", Value: "true"}}, "0123456-dirty"},
		{"no vcs stamp (-buildvcs=false, no .git)", []debug.BuildSetting{{Key: "GOOS", Value: "linux"}}, Unknown},
	} {
		if got := vcsCommit(tc.settings); got != tc.want {
			t.Errorf("%s: vcsCommit = %q, want %q", tc.name, got, tc.want)
		}
	}
}

// The stamped values win over the toolchain's; unstamped, the version is
// "dev" and the commit whatever the toolchain recorded (a test binary
// records none).
func TestLine(t *testing.T) {
	if got := Line("reaper"); !strings.HasPrefix(got, "reaper dev (commit ") || !strings.HasSuffix(got, ", "+GoVersion()+")") {
		t.Errorf("unstamped Line = %q", got)
	}
	version, commit = "0.2.0", "abc1234-dirty"
	t.Cleanup(func() { version, commit = "", "" })
	if got, want := Line("enqueuer"), "enqueuer 0.2.0 (commit abc1234-dirty, "+GoVersion()+")"; got != want {
		t.Errorf("Line = %q, want %q", got, want)
	}
}

// The VERSION file the builds stamp from holds one semantic version, and
// CHANGELOG.md has a section for it.
func TestVersionFile(t *testing.T) {
	b, err := os.ReadFile("../../VERSION")
	if err != nil {
		t.Fatal(err)
	}
	v := string(b)
	if !regexp.MustCompile(`^\d+\.\d+\.\d+\n$`).MatchString(v) {
		t.Fatalf("VERSION is %q, want one line MAJOR.MINOR.PATCH", v)
	}
	changelog, err := os.ReadFile("../../CHANGELOG.md")
	if err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`(?m)^## .*\b` + regexp.QuoteMeta(strings.TrimSpace(v)) + `\b`).Match(changelog) {
		t.Errorf("CHANGELOG.md has no section for version %s", strings.TrimSpace(v))
	}
}
