package imagetest

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemd/idemd/internal/daemon"
	"github.com/idemd/idemd/internal/testing/dbtest"
	"github.com/idemd/idemd/internal/testing/scratchdb"
	"github.com/idemd/idemd/internal/testing/testwait"
)

func TestMain(m *testing.M) { dbtest.Main(m) }

// image is the tag the tests build and run; one per test binary run keeps
// two concurrent runs from removing each other's image.
var image = fmt.Sprintf("localhost/idemd:imagetest-%d", os.Getpid())

// commands are the image's binaries, in /usr/local/bin: idemd's, and
// Rocket Rides (examples/rocketrides), which the dev overlay runs.
var commands = []string{"enqueuer", "completer", "reaper", "idemctl", "rocketrides"}

// requireTools skips the test without buildah, podman and runc, or fails it
// with CI=true.
func requireTools(t *testing.T) {
	t.Helper()
	var missing []string
	for _, tool := range []string{"buildah", "podman", "runc"} {
		if _, err := exec.LookPath(tool); err != nil {
			missing = append(missing, tool)
		}
	}
	if len(missing) == 0 {
		return
	}
	msg := fmt.Sprintf("no %s on this machine: scripts/ensure-buildah.sh installs them", strings.Join(missing, ", "))
	if os.Getenv("CI") == "true" {
		t.Fatal(msg + " (CI=true: the image test must run)")
	}
	t.Skip(msg)
}

var (
	buildOnce sync.Once
	buildErr  error
)

// buildImage runs scripts/build-image.sh once per test binary run and
// removes the image when the tests end (TestMain's dbtest.Main runs after
// every test's cleanup, so the last test's cleanup does).
func buildImage(t *testing.T) {
	t.Helper()
	requireTools(t)
	buildOnce.Do(func() {
		start := time.Now()
		cmd := exec.Command(filepath.Join(repoRoot(t), "scripts", "build-image.sh"), image)
		out, err := cmd.CombinedOutput()
		if err != nil {
			buildErr = fmt.Errorf("scripts/build-image.sh: %v\n%s", err, out)
			return
		}
		t.Logf("image %s built in %s: %s", image, time.Since(start).Round(time.Millisecond), strings.TrimSpace(string(out)))
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
}

func repoRoot(t *testing.T) string {
	t.Helper()
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		t.Fatal("no caller")
	}
	return filepath.Join(filepath.Dir(file), "..", "..", "..")
}

// TestImage builds the image and runs each command from it.
func TestImage(t *testing.T) {
	buildImage(t)
	t.Cleanup(func() { _ = exec.Command("podman", "rmi", "--force", image).Run() })

	t.Run("layout", testLayout)
	t.Run("help", testHelp)
	t.Run("version", testVersion)
	t.Run("bad configuration exits 2", testBadConfig)
	t.Run("migrate, reaper dry run, enqueuer ready, SIGTERM exits 0", testMigrateAndRun)
}

// The image is what deploy/Dockerfile describes: its binaries, CA bundle
// and zoneinfo in place, root-owned and not writable by the user it runs
// as, uid 65532, idemctl as the entrypoint.
func testLayout(t *testing.T) {
	var inspect []struct {
		Config struct {
			User       string
			Entrypoint []string
			Cmd        []string
			Labels     map[string]string
		}
	}
	out := podman(t, "image", "inspect", image)
	if err := json.Unmarshal(out, &inspect); err != nil || len(inspect) != 1 {
		t.Fatalf("podman image inspect: %v\n%s", err, out)
	}
	cfg := inspect[0].Config
	if cfg.User != "65532:65532" || !slices.Equal(cfg.Entrypoint, []string{"/usr/local/bin/idemctl"}) || !slices.Equal(cfg.Cmd, []string{"--help"}) {
		t.Errorf("image config: user %q entrypoint %q cmd %q", cfg.User, cfg.Entrypoint, cfg.Cmd)
	}
	for k, v := range wantLabels(t) {
		if cfg.Labels[k] != v {
			t.Errorf("label %s = %q, want %q", k, cfg.Labels[k], v)
		}
	}

	id := strings.TrimSpace(string(podman(t, "create", image)))
	t.Cleanup(func() { _ = exec.Command("podman", "rm", "--force", id).Run() })
	files := map[string]*tar.Header{}
	tr := tar.NewReader(bytes.NewReader(podman(t, "export", id)))
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		files[strings.TrimPrefix(strings.TrimPrefix(h.Name, "./"), "/")] = h
	}
	want := map[string]int64{ // path -> permission bits
		"etc/ssl/certs/ca-certificates.crt": 0o644,
		"usr/share/zoneinfo/Etc/UTC":        0o644,
		"usr/share/zoneinfo/Europe/Berlin":  0o644,
		"etc/passwd":                        0o644,
	}
	for _, c := range commands {
		want["usr/local/bin/"+c] = 0o755
	}
	for path, mode := range want {
		h, ok := files[path]
		switch {
		case !ok:
			t.Errorf("%s is missing from the image", path)
		case h.Typeflag != tar.TypeReg || h.Mode&0o777 != mode || h.Uid != 0:
			t.Errorf("%s: type %c mode %o uid %d, want a regular file, mode %o, owned by root", path, h.Typeflag, h.Mode&0o777, h.Uid, mode)
		}
	}
	if h, ok := files["etc/ssl/certs/ca-certificates.crt"]; ok && h.Size < 10_000 {
		t.Errorf("CA bundle of %d bytes", h.Size)
	}
	for path := range files {
		for _, shell := range []string{"bin/sh", "usr/bin/apt-get"} {
			if path == shell {
				t.Errorf("the image has %s", path)
			}
		}
	}
}

// wantLabels are the image's OCI labels: the release of the VERSION file
// and this checkout's commit, as scripts/buildinfo.sh stamps them into the
// binaries.
func wantLabels(t *testing.T) map[string]string {
	t.Helper()
	return map[string]string{
		"org.opencontainers.image.title":    "idemd",
		"org.opencontainers.image.version":  buildScript(t, "version"),
		"org.opencontainers.image.revision": buildScript(t, "commit"),
		"org.opencontainers.image.source":   "https://github.com/idemd/idemd",
		"org.opencontainers.image.licenses": "Apache-2.0",
	}
}

// buildScript runs scripts/buildinfo.sh what.
func buildScript(t *testing.T, what string) string {
	t.Helper()
	out, err := exec.Command(filepath.Join(repoRoot(t), "scripts", "buildinfo.sh"), what).Output()
	if err != nil {
		t.Fatalf("scripts/buildinfo.sh %s: %v", what, err)
	}
	return strings.TrimSpace(string(out))
}

// --version of every command, from the image, exits 0 and names the
// command, the release and commit the image was built from, and the Go
// version.
func testVersion(t *testing.T) {
	version, commit := buildScript(t, "version"), buildScript(t, "commit")
	for _, c := range commands {
		code, stdout, stderr := runIn(t, c, "--version")
		want := regexp.MustCompile(`^` + c + ` ` + regexp.QuoteMeta(version) + ` \(commit ` + regexp.QuoteMeta(commit) + `, go1\.[0-9.]+\)\n$`)
		if code != 0 || !want.MatchString(stdout) {
			t.Errorf("%s --version: exit %d\nstdout: %q, want %s\nstderr: %s", c, code, stdout, want, stderr)
		}
	}
}

// --help of every command, from the image, exits 0 and prints its usage;
// the bare image prints idemctl's.
func testHelp(t *testing.T) {
	for _, c := range commands {
		code, stdout, stderr := runIn(t, c, "--help")
		if code != 0 || !strings.HasPrefix(stdout, "Usage: "+c) {
			t.Errorf("%s --help: exit %d\nstdout: %s\nstderr: %s", c, code, stdout, stderr)
		}
	}
	code, stdout, stderr := runIn(t, "")
	if code != 0 || !strings.HasPrefix(stdout, "Usage: idemctl") {
		t.Errorf("bare image: exit %d\nstdout: %s\nstderr: %s", code, stdout, stderr)
	}
}

// Bad configuration exits 2, with every problem named.
func testBadConfig(t *testing.T) {
	for _, tc := range []struct {
		cmd  string
		args []string
		want []string
	}{
		{"enqueuer", []string{"--batch-size=abc", "--log-level", "loud"}, []string{"--batch-size", "--log-level", "--database-url"}},
		{"completer", []string{"--database-url", "postgres://u@127.0.0.1:1/d"}, []string{"--api-url", "--auth-secret-file"}},
		{"reaper", []string{"--database-url", "postgres://u@127.0.0.1:1/d", "--retention", "1y"}, []string{"--retention"}},
		{"idemctl", []string{"migrate"}, []string{"--database-url"}},
	} {
		code, _, stderr := runIn(t, tc.cmd, tc.args...)
		if code != daemon.ExitConfig {
			t.Errorf("%s %q: exit %d, want %d\n%s", tc.cmd, tc.args, code, daemon.ExitConfig, stderr)
		}
		for _, w := range tc.want {
			if !strings.Contains(stderr, w) {
				t.Errorf("%s %q: stderr does not name %s:\n%s", tc.cmd, tc.args, w, stderr)
			}
		}
	}
}

// idemctl migrate from the image migrates a fresh database, a reaper dry
// run reads it, the enqueuer from the image becomes ready on it, and
// SIGTERM ends the enqueuer with exit 0.
func testMigrateAndRun(t *testing.T) {
	ctx := context.Background()
	dbURL, drop, err := scratchdb.Create(ctx, dbtest.ServerURL(t), "idemd_image")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = drop(context.Background()) })

	code, stdout, stderr := runIn(t, "idemctl", "migrate", "--database-url", dbURL, "--log-level", "warn")
	if code != 0 || !strings.Contains(stdout, "migrate: applied") {
		t.Fatalf("idemctl migrate: exit %d\nstdout: %s\nstderr: %s", code, stdout, stderr)
	}

	// A one-shot command from the image, next to nothing: it needs no
	// writable file and no port.
	code, stdout, stderr = runIn(t, "reaper", "--dry-run", "--database-url", dbURL)
	if code != 0 || !strings.Contains(stdout, "dry run") {
		t.Errorf("reaper --dry-run: exit %d\nstdout: %s\nstderr: %s", code, stdout, stderr)
	}

	addr := freeAddr(t)
	name := fmt.Sprintf("idemd-imagetest-%d-enqueuer", os.Getpid())
	t.Cleanup(func() { _ = exec.Command("podman", "rm", "--force", name).Run() })
	podman(t, append(append([]string{"run", "--detach", "--name", name}, runFlags("enqueuer")...),
		image, "--database-url", dbURL, "--http-addr", addr)...)

	readyz := func() (int, string) {
		resp, err := http.Get("http://" + addr + "/readyz")
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body)
	}
	testwait.Until(t, 2*time.Minute, "the enqueuer in the image to answer /readyz 200", func() bool {
		if state := strings.TrimSpace(string(podman(t, "inspect", "--format", "{{.State.Status}}", name))); state == "exited" {
			logs, _ := exec.Command("podman", "logs", name).CombinedOutput()
			t.Fatalf("the enqueuer exited before it was ready:\n%s", logs)
		}
		code, _ := readyz()
		return code == http.StatusOK
	})

	podman(t, "kill", "--signal", "TERM", name)
	waitCtx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	out, err := exec.CommandContext(waitCtx, "podman", "wait", name).CombinedOutput()
	if err != nil {
		t.Fatalf("podman wait: %v\n%s", err, out)
	}
	if exit, err := strconv.Atoi(strings.TrimSpace(string(out))); err != nil || exit != 0 {
		logs, _ := exec.Command("podman", "logs", name).CombinedOutput()
		t.Errorf("enqueuer after SIGTERM: exit %q, want 0\n%s", strings.TrimSpace(string(out)), logs)
	}
}

// runFlags are podman run's flags for cmd ("" for the image's entrypoint):
// as Kubernetes runs the manifests (read-only root, uid 65532), on runc
// with explicit ulimits, on the host's network to reach the test database
// on 127.0.0.1.
func runFlags(cmd string) []string {
	f := []string{
		"--runtime", "runc", "--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1024:1024",
		"--read-only", "--user", "65532", "--network", "host", "--cap-drop", "ALL",
	}
	if cmd != "" {
		f = append(f, "--entrypoint", "/usr/local/bin/"+cmd)
	}
	return f
}

// runIn runs cmd from the image with args to completion.
func runIn(t *testing.T, cmd string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c := exec.CommandContext(ctx, "podman", append(append(append([]string{"run", "--rm"}, runFlags(cmd)...), image), args...)...)
	var out, errOut bytes.Buffer
	c.Stdout, c.Stderr = &out, &errOut
	err := c.Run()
	var exit *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &exit):
		code = exit.ExitCode()
	default:
		t.Fatalf("podman run %s: %v", cmd, err)
	}
	return code, out.String(), errOut.String()
}

// podman runs a podman command that must succeed and returns its stdout.
func podman(t *testing.T, args ...string) []byte {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var stderr bytes.Buffer
	c := exec.CommandContext(ctx, "podman", args...)
	c.Stderr = &stderr
	out, err := c.Output()
	if err != nil {
		t.Fatalf("podman %s: %v\n%s", strings.Join(args, " "), err, stderr.String())
	}
	return out
}

// freeAddr returns a loopback address nothing listens on.
func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}
