// Package release reads the one record of idemd's releases: the link table
// at the end of CHANGELOG.md, one line per release naming the commit it was
// cut from,
//
//	[0.1.0]: https://github.com/idemd/idemd/tree/dd2a8bd9bf027656a2827f0b0703c165978eeddc
//
// Tags point at the same commits once a release is published, but a clone
// may lack them and a tag can move; the table is reviewed with the code and
// cannot. Tests that need an earlier release (the upgrade test builds the
// previous one) take its commit from here.
package release

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
)

// Release is one released version and the commit it was built from.
type Release struct {
	Version string // MAJOR.MINOR.PATCH, no "v"
	Commit  string // the full 40-hex commit hash
}

// linkLine is one release's line of the link table.
var linkLine = regexp.MustCompile(`(?m)^\[(\d+\.\d+\.\d+)\]: https://github\.com/idemd/idemd/tree/([0-9a-f]{40})$`)

// Parse returns the releases recorded in changelog's link table, in the
// table's order, newest first. A table out of order or naming a version
// twice is an error: the newest release is the first line.
func Parse(changelog string) ([]Release, error) {
	var out []Release
	for _, m := range linkLine.FindAllStringSubmatch(changelog, -1) {
		r := Release{Version: m[1], Commit: m[2]}
		if n := len(out); n > 0 && Compare(out[n-1].Version, r.Version) <= 0 {
			return nil, fmt.Errorf("release.Parse: %s is listed after %s: the link table lists the newest release first", r.Version, out[n-1].Version)
		}
		out = append(out, r)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("release.Parse: no release line ([X.Y.Z]: https://github.com/idemd/idemd/tree/<commit>) in the changelog")
	}
	return out, nil
}

// Latest is the newest recorded release: the one before the release being
// prepared.
func Latest(changelog string) (Release, error) {
	rs, err := Parse(changelog)
	if err != nil {
		return Release{}, err
	}
	return rs[0], nil
}

// ReadChangelog reads CHANGELOG.md at the top of the repository dir is in.
func ReadChangelog(dir string) (string, error) {
	dir, err := filepath.Abs(dir)
	if err != nil {
		return "", fmt.Errorf("release.ReadChangelog: %w", err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			b, err := os.ReadFile(filepath.Join(dir, "CHANGELOG.md"))
			if err != nil {
				return "", fmt.Errorf("release.ReadChangelog: %w", err)
			}
			return string(b), nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("release.ReadChangelog: no go.mod above %s", dir)
		}
		dir = parent
	}
}

// Compare orders two MAJOR.MINOR.PATCH versions: -1, 0 or 1. A part that is
// not a number compares as 0.
func Compare(a, b string) int {
	pa, pb := strings.Split(a, "."), strings.Split(b, ".")
	for i := 0; i < 3; i++ {
		x, y := part(pa, i), part(pb, i)
		if x != y {
			if x < y {
				return -1
			}
			return 1
		}
	}
	return 0
}

func part(p []string, i int) int {
	if i >= len(p) {
		return 0
	}
	n, _ := strconv.Atoi(p[i])
	return n
}
