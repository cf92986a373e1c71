package releasetest

import (
	"archive/tar"
	"compress/gzip"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// ecosystemVersions is what each ecosystem calls version v, as
// scripts/package-clients.sh names it: a release is X.Y.Z everywhere; a
// development build X.Y.Z-dev+<commit> is gem X.Y.Z.dev.g<commit>, Python
// X.Y.Z.dev0+g<commit> and npm X.Y.Z-dev.g<commit> ("." for "-").
func ecosystemVersions(t *testing.T, v string) (gem, py, npm string) {
	t.Helper()
	if regexp.MustCompile(`^\d+\.\d+\.\d+$`).MatchString(v) {
		return v, v, v
	}
	m := regexp.MustCompile(`^(\d+\.\d+\.\d+)-dev\+([0-9A-Za-z.-]+)$`).FindStringSubmatch(v)
	if m == nil {
		t.Fatalf("version %q is neither a release nor a development build", v)
	}
	local := "g" + strings.ReplaceAll(m[2], "-", ".")
	return m[1] + ".dev." + local, m[1] + ".dev0+" + local, m[1] + "-dev." + local
}

// testPackages: the gem, the sdist, the wheel and the npm tarball install
// offline into a directory of their own, and the library loads from there
// with the version of the release.
func testPackages(t *testing.T, extra, version string) {
	gemV, pyV, npmV := ecosystemVersions(t, version)
	const timeout = 2 * time.Minute

	t.Run("gem", func(t *testing.T) {
		tmp := t.TempDir()
		file := filepath.Join(extra, "idemd-replayauth-"+gemV+".gem")
		run(t, tmp, nil, timeout, "gem", "install", "--local", "--no-document", "--install-dir", tmp, file)
		got := run(t, tmp, []string{"GEM_HOME=" + tmp, "GEM_PATH=" + tmp}, timeout, "ruby", "-e",
			`gem "idemd-replayauth"; require "idemd/replay_auth"; `+
				`raise "loaded from #{$LOADED_FEATURES.grep(/replay_auth/)}" unless $LOADED_FEATURES.grep(/replay_auth/).all? { |f| f.start_with?(ENV["GEM_HOME"]) }; `+
				`print Gem.loaded_specs["idemd-replayauth"].version, " ", Idemd::ReplayAuth::MSG_UNAUTHORIZED`)
		if got != gemV+" Replay signature rejected." {
			t.Errorf("installed gem: %q, want version %s and the library loaded", got, gemV)
		}
	})

	// The sdist's name has the project's "-" or, with a newer setuptools,
	// "_" (PEP 625).
	sdists, _ := filepath.Glob(filepath.Join(extra, "idemd?replayauth-"+pyV+".tar.gz"))
	if len(sdists) != 1 {
		t.Errorf("want one sdist of version %s, found %v", pyV, sdists)
	}
	for _, file := range append([]string{"idemd_replayauth-" + pyV + "-py3-none-any.whl"}, relative(sdists)...) {
		t.Run(file, func(t *testing.T) {
			tmp := t.TempDir()
			site := filepath.Join(tmp, "site")
			// An sdist builds with the installed setuptools (no index).
			run(t, tmp, nil, timeout, "/usr/bin/python3", "-m", "pip", "install", "--no-deps", "--no-index",
				"--no-build-isolation", "--target", site, filepath.Join(extra, file))
			q, _ := json.Marshal(site)
			got := run(t, tmp, nil, timeout, "/usr/bin/python3", "-I", "-c",
				"import sys; sys.path.insert(0, "+string(q)+"); import importlib.metadata as m, idemd_replayauth as ra; "+
					"assert ra.__file__.startswith("+string(q)+"), ra.__file__; "+
					"print(m.version('idemd-replayauth'), ra.MSG_UNAUTHORIZED, end='')")
			if got != pyV+" Replay signature rejected." {
				t.Errorf("installed %s: %q, want version %s and the library loaded", file, got, pyV)
			}
		})
	}

	t.Run("npm", func(t *testing.T) {
		tmp := t.TempDir()
		file := filepath.Join(extra, "idemd-replayauth-"+npmV+".tgz")
		for _, f := range tarNames(t, file) {
			if f != "package/package.json" && f != "package/replayauth.js" && f != "package/uniquekey.js" && !strings.HasPrefix(f, "package/LICENSE") && !strings.HasPrefix(f, "package/README") {
				t.Errorf("the npm tarball ships %s", f)
			}
		}
		run(t, tmp, []string{"npm_config_offline=true"}, timeout, "npm", "install", "--no-audit", "--no-fund", "--loglevel=error", file)
		got := run(t, tmp, nil, timeout, "node", "-e",
			`const ra = require("idemd-replayauth"); const p = require("idemd-replayauth/package.json"); `+
				`if (!require.resolve("idemd-replayauth").startsWith(process.cwd())) throw new Error("loaded from " + require.resolve("idemd-replayauth")); `+
				`if (p.private) throw new Error("the package is private: npm would not publish it"); `+
				`if (typeof require("idemd-replayauth/uniquekey").uniqueKey !== "function") throw new Error("no uniqueKey helper"); `+
				`process.stdout.write(p.version + " " + ra.MSG_UNAUTHORIZED)`)
		if got != npmV+" Replay signature rejected." {
			t.Errorf("installed npm package: %q, want version %s and the library loaded", got, npmV)
		}
	})
}

// tarNames lists a .tar.gz's entries.
func tarNames(t *testing.T, path string) []string {
	t.Helper()
	var names []string
	walkTar(t, path, func(h *tar.Header, _ io.Reader) { names = append(names, h.Name) })
	return names
}

// untar extracts a .tar.gz's regular files into dir.
func untar(t *testing.T, path, dir string) {
	t.Helper()
	walkTar(t, path, func(h *tar.Header, r io.Reader) {
		if h.Typeflag != tar.TypeReg {
			return
		}
		dest := filepath.Join(dir, filepath.Clean("/"+h.Name))
		if err := os.MkdirAll(filepath.Dir(dest), 0o755); err != nil {
			t.Fatal(err)
		}
		f, err := os.OpenFile(dest, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, os.FileMode(h.Mode)&0o755)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := io.Copy(f, r); err != nil {
			t.Fatal(err)
		}
		if err := f.Close(); err != nil {
			t.Fatal(err)
		}
	})
}

func walkTar(t *testing.T, path string, fn func(*tar.Header, io.Reader)) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	tr := tar.NewReader(zr)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return
		}
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		fn(h, tr)
	}
}

func relative(paths []string) []string {
	var out []string
	for _, p := range paths {
		out = append(out, filepath.Base(p))
	}
	return out
}
