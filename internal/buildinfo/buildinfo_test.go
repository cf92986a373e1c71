package buildinfo

import (
	"os"
	"os/exec"
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

// scripts/buildinfo.sh names an untagged build a development build of the
// VERSION file's release, and refuses a release version that is not the
// VERSION file's (a tag or IDEMD_VERSION, as the release workflow gives).
func TestBuildinfoScriptVersion(t *testing.T) {
	b, err := os.ReadFile("../../VERSION")
	if err != nil {
		t.Fatal(err)
	}
	file := strings.TrimSpace(string(b))
	run := func(env ...string) (string, error) {
		cmd := exec.Command("../../scripts/buildinfo.sh", "version")
		cmd.Env = append(os.Environ(), env...)
		out, err := cmd.Output()
		return strings.TrimSpace(string(out)), err
	}
	if got, err := run("IDEMD_VERSION=v" + file); err != nil || got != file {
		t.Errorf("IDEMD_VERSION=v%s: %q, %v; want %s", file, got, err, file)
	}
	if got, err := run("IDEMD_VERSION=" + file + "-dev+abc1234"); err != nil || got != file+"-dev+abc1234" {
		t.Errorf("a development version passed on: %q, %v", got, err)
	}
	if got, err := run("IDEMD_VERSION=99.0.0"); err == nil {
		t.Errorf("IDEMD_VERSION=99.0.0 with VERSION %s: %q, want a refusal", file, got)
	}
	tag, tagErr := exec.Command("git", "describe", "--tags", "--exact-match", "--match", "v[0-9]*", "HEAD").Output()
	got, err := run("IDEMD_VERSION=")
	switch {
	case err != nil:
		t.Errorf("untagged: %v", err)
	case tagErr == nil && got != strings.TrimPrefix(strings.TrimSpace(string(tag)), "v"):
		t.Errorf("on tag %s: version %q", tag, got)
	case tagErr != nil && !regexp.MustCompile(`^`+regexp.QuoteMeta(file)+`-dev\+[0-9a-f]{7,}(-dirty)?$`).MatchString(got):
		t.Errorf("untagged: version %q, want %s-dev+<commit>", got, file)
	}
}

// A binary `go install ...@vX.Y.Z` built names that release; any other
// module version (a checkout's pseudo-version, "(devel)") is "dev".
func TestModuleVersion(t *testing.T) {
	for v, want := range map[string]string{
		"v0.2.0":      "0.2.0",
		"v0.2.1-rc.1": "dev",
		"v0.0.0-20261206030000-6dcd322c0a1b+dirty": "dev",
		"(devel)": "dev",
		"":        "dev",
	} {
		if got := moduleVersion(v); got != want {
			t.Errorf("moduleVersion(%q) = %q, want %q", v, got, want)
		}
	}
}
