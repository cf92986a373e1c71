package clients

import (
	"archive/zip"
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/idemd/idemd/clients/clienttest"
)

// packTimeout bounds one packaging tool's run (seconds here, offline).
const packTimeout = 2 * time.Minute

// version is idemd's VERSION, which each language's package carries.
func version(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(clienttest.Root(t), "VERSION"))
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

// tool returns name's path, or fails (CI) or skips the test.
func tool(t *testing.T, name string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		missingTool(t, name)
	}
	return p
}

// TestPackages builds each language's package with the ecosystem's own
// tool, offline, as docs/languages/*.md tell an API to install it, and
// loads the library from what was installed, not from the source tree.
func TestPackages(t *testing.T) {
	want := version(t)
	root := clienttest.Root(t)

	t.Run("ruby gem", func(t *testing.T) {
		rb := clienttest.Ruby(t)
		gem := tool(t, "gem")
		tmp := t.TempDir()
		out := filepath.Join(tmp, "idemd-replayauth.gem")
		clienttest.Run(t, filepath.Join(root, "clients", "ruby"), nil, packTimeout, gem, "build", "idemd-replayauth.gemspec", "--output", out)
		home := filepath.Join(tmp, "gems")
		clienttest.Run(t, tmp, nil, packTimeout, gem, "install", "--local", "--no-document", "--install-dir", home, out)
		// Only the installed gem is on the load path: the check fails if
		// the gem lacks the library.
		got := clienttest.Run(t, tmp, []string{"GEM_HOME=" + home, "GEM_PATH=" + home}, packTimeout, rb, "-e",
			`gem "idemd-replayauth"; require "idemd/replay_auth"; require "idemd/unique_key"; `+
				`raise "loaded from #{$LOADED_FEATURES.grep(/replay_auth|unique_key/)}" unless $LOADED_FEATURES.grep(/replay_auth|unique_key/).all? { |f| f.start_with?(ENV["GEM_HOME"]) }; `+
				`print "version=", Gem.loaded_specs["idemd-replayauth"].version, " ", Idemd::ReplayAuth::MSG_UNAUTHORIZED, " ", Idemd::UniqueKey.unique_states`)
		if !strings.Contains(got, "version="+want+" Replay signature rejected. 11110101") {
			t.Fatalf("installed gem: %q, want version %s and the library loaded", got, want)
		}
	})

	t.Run("python wheel", func(t *testing.T) {
		py := clienttest.Python(t)
		if exec.Command(py, "-m", "pip", "--version").Run() != nil {
			missingTool(t, "pip for "+py+" (Debian: python3-pip)")
		}
		tmp := t.TempDir()
		// A copy: setuptools writes build/ and *.egg-info next to the source.
		src := filepath.Join(tmp, "src")
		copyTree(t, filepath.Join(root, "clients", "python"), src, "pyproject.toml", "idemd_replayauth")
		dist := filepath.Join(tmp, "dist")
		clienttest.Run(t, tmp, nil, packTimeout, py, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
			"--no-index", "--wheel-dir", dist, src)
		wheels, _ := filepath.Glob(filepath.Join(dist, "idemd_replayauth-"+want+"-py3-none-any.whl"))
		if len(wheels) != 1 {
			all, _ := filepath.Glob(filepath.Join(dist, "*"))
			t.Fatalf("wheel for version %s not built: %v", want, all)
		}
		if !zipHas(t, wheels[0], "idemd_replayauth/__init__.py") {
			t.Fatalf("%s lacks idemd_replayauth/__init__.py", wheels[0])
		}
		site := filepath.Join(tmp, "site")
		clienttest.Run(t, tmp, nil, packTimeout, py, "-m", "pip", "install", "--no-deps", "--no-index",
			"--target", site, wheels[0])
		got := clienttest.Run(t, tmp, nil, packTimeout, py, "-I", "-c",
			"import sys; sys.path.insert(0, "+pyString(site)+"); import importlib.metadata as m, idemd_replayauth as ra; "+
				"assert ra.__file__.startswith("+pyString(site)+"), ra.__file__; "+
				"print('version=' + m.version('idemd-replayauth'), ra.MSG_UNAUTHORIZED, ra.unique_states())")
		if !strings.Contains(got, "version="+want+" Replay signature rejected. 11110101") {
			t.Fatalf("installed wheel: %q, want version %s and the library loaded", got, want)
		}
	})

	t.Run("npm package", func(t *testing.T) {
		clienttest.Node(t)
		npm := tool(t, "npm")
		got := clienttest.Run(t, filepath.Join(root, "clients", "node"), []string{"npm_config_offline=true"}, packTimeout,
			npm, "pack", "--dry-run", "--json", "--loglevel=error")
		var packs []struct {
			Name    string
			Version string
			Files   []struct{ Path string }
		}
		if err := json.Unmarshal([]byte(got[strings.Index(got, "["):]), &packs); err != nil || len(packs) != 1 {
			t.Fatalf("npm pack --dry-run --json: %v\n%s", err, got)
		}
		p := packs[0]
		var files []string
		for _, f := range p.Files {
			files = append(files, f.Path)
		}
		if p.Name != "idemd-replayauth" || p.Version != want || !contains(files, "replayauth.js") || !contains(files, "uniquekey.js") || !contains(files, "package.json") {
			t.Fatalf("npm pack: %s %s %v, want idemd-replayauth %s with replayauth.js and uniquekey.js", p.Name, p.Version, files, want)
		}
		for _, f := range files {
			if strings.HasPrefix(f, "test/") || strings.HasPrefix(f, "example/") {
				t.Errorf("npm pack ships %s", f)
			}
		}
		// The Express example installs the package from its path
		// (package.json: "file:.."), and its test runs on it (TestNode).
	})
}

func missingTool(t *testing.T, what string) {
	t.Helper()
	if os.Getenv("CI") == "true" {
		t.Fatalf("%s missing (scripts/ensure-runtimes.sh installs it)", what)
	}
	t.Skipf("%s missing (scripts/ensure-runtimes.sh installs it)", what)
}

// pyString quotes s as a Python string literal (JSON's is one for a path).
func pyString(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

func zipHas(t *testing.T, path, name string) bool {
	t.Helper()
	r, err := zip.OpenReader(path)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	for _, f := range r.File {
		if f.Name == name {
			return true
		}
	}
	return false
}

// copyTree copies the named entries of from (files or directories) into to.
func copyTree(t *testing.T, from, to string, names ...string) {
	t.Helper()
	for _, n := range names {
		err := filepath.Walk(filepath.Join(from, n), func(p string, info os.FileInfo, err error) error {
			if err != nil {
				return err
			}
			rel, err := filepath.Rel(from, p)
			if err != nil {
				return err
			}
			dst := filepath.Join(to, rel)
			if info.IsDir() {
				if info.Name() == "__pycache__" {
					return filepath.SkipDir
				}
				return os.MkdirAll(dst, 0o755)
			}
			if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
				return err
			}
			in, err := os.Open(p)
			if err != nil {
				return err
			}
			defer in.Close()
			out, err := os.Create(dst)
			if err != nil {
				return err
			}
			if _, err := io.Copy(out, in); err != nil {
				out.Close()
				return err
			}
			return out.Close()
		})
		if err != nil {
			t.Fatalf("copy %s: %v", n, err)
		}
	}
}
