// Package buildinfo is what a binary knows about its own build: the release
// version and the source commit it was built from, which the builds stamp
// (scripts/buildinfo.sh's ldflags, used by `make build` and both image
// builds), and the Go version. --version prints it and every daemon exports
// it as idemd_build_info.
package buildinfo

import (
	"fmt"
	"regexp"
	"runtime"
	"runtime/debug"
)

// Stamped with -ldflags -X by scripts/buildinfo.sh: version from the VERSION
// file at the repository root, commit from git (short hash, "-dirty" when
// the tree had changes). Unexported so nothing can change them at run
// time.
var (
	version string
	commit  string
)

// Unknown stands for a part of the build nobody recorded.
const Unknown = "unknown"

// Version is the release this binary was built as: the stamped one; else,
// for `go install github.com/idemd/idemd/cmd/...@vX.Y.Z`, which stamps
// nothing but builds a released module version, X.Y.Z; else "dev" (a plain
// `go build`).
func Version() string {
	if version != "" {
		return version
	}
	if info, ok := debug.ReadBuildInfo(); ok {
		return moduleVersion(info.Main.Version)
	}
	return "dev"
}

// release is a module version that is a release tag: no pseudo-version, no
// pre-release, no "+dirty".
var release = regexp.MustCompile(`^v(\d+\.\d+\.\d+)$`)

// moduleVersion is the release a main module's version names, or "dev".
func moduleVersion(v string) string {
	if m := release.FindStringSubmatch(v); m != nil {
		return m[1]
	}
	return "dev"
}

// Commit is the short hash of the commit the binary was built from: the
// stamped one, else the one the Go toolchain records for a plain `go build`
// in a git checkout (vcs.revision), else Unknown.
func Commit() string {
	if commit != "" {
		return commit
	}
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return Unknown
	}
	return vcsCommit(info.Settings)
}

// shortHash is as long as git's own short hashes on a small repository.
const shortHash = 7

// vcsCommit reads the commit from the toolchain's build settings, in the
// form the builds stamp: short, "-dirty" for a modified tree.
func vcsCommit(settings []debug.BuildSetting) string {
	var rev string
	dirty := false
	for _, s := range settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			dirty = s.Value == "true"
		}
	}
	if rev == "" {
		return Unknown
	}
	if len(rev) > shortHash {
		rev = rev[:shortHash]
	}
	if dirty {
		rev += "-dirty"
	}
	return rev
}

// GoVersion is the Go release the binary was compiled with.
func GoVersion() string { return runtime.Version() }

// Line is what `<name> --version` prints: enqueuer 0.2.0 (commit abc1234,
// go1.26.8).
func Line(name string) string {
	return fmt.Sprintf("%s %s (commit %s, %s)", name, Version(), Commit(), GoVersion())
}
