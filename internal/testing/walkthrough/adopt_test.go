package walkthrough

import (
	"context"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/idemd/idemd/clients/clienttest"
)

// page is the guide whose commands the test runs, from the repository root.
const page = "docs/adopt.md"

// block is a fenced block whose info string is "sh walkthrough".
var block = regexp.MustCompile("(?ms)^```sh walkthrough\\s*\\n(.*?)^```\\s*$")

// ports are the addresses the page uses; none may be taken when it runs.
var ports = []string{"18480", "18481", "18482", "18483", "18484", "18485", "18486"}

// commands returns the page's runnable blocks, in order.
func commands(t *testing.T, text string) []string {
	t.Helper()
	var out []string
	for _, m := range block.FindAllStringSubmatch(text, -1) {
		out = append(out, m[1])
	}
	if len(out) < 6 {
		t.Fatalf("%s has %d `sh walkthrough` blocks; the extraction is broken or the page lost its steps", page, len(out))
	}
	return out
}

// TestAdoptPageRuns runs docs/adopt.md's local steps: roles, migrate, a Go
// API with the enqueuer and the completer, then a Python API with the
// completer and the reaper only, each finishing an abandoned request. The
// page's own checks (a key finished, the staged jobs moved) are the
// oracle: a failing one fails the script under `set -e`.
func TestAdoptPageRuns(t *testing.T) {
	root := clienttest.Root(t)
	text, err := os.ReadFile(filepath.Join(root, page))
	if err != nil {
		t.Fatal(err)
	}
	blocks := commands(t, string(text))
	needServer(t)
	for _, p := range ports {
		if c, err := net.DialTimeout("tcp", "127.0.0.1:"+p, time.Second); err == nil {
			c.Close()
			t.Fatalf("127.0.0.1:%s is in use; %s needs it", p, page)
		}
	}
	for _, tool := range []string{"psql", "curl", "make", "bash"} {
		if _, err := exec.LookPath(tool); err != nil {
			missing(t, tool+" is not on PATH")
		}
	}
	// The page says python3; the tests use Debian's, which has psycopg2.
	pyDir := t.TempDir()
	if err := os.Symlink(clienttest.Python(t), filepath.Join(pyDir, "python3")); err != nil {
		t.Fatal(err)
	}

	// The page recreates its database at the start and leaves it, as a
	// reader's run would; the test drops it.
	t.Cleanup(func() {
		drop := exec.Command("psql", "-h", "127.0.0.1", "-U", "postgres", "-q", "-c", "DROP DATABASE IF EXISTS idemd_adopt WITH (FORCE)")
		if out, err := drop.CombinedOutput(); err != nil {
			t.Errorf("drop the walkthrough's database: %v\n%s", err, out)
		}
	})

	script := "set -euo pipefail\n" + strings.Join(blocks, "\n")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "-c", script)
	cmd.Dir = root
	// The page's own environment, not the caller's database settings.
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "DATABASE_URL=") && !strings.HasPrefix(kv, "IDEMD_") && !strings.HasPrefix(kv, "PATH=") {
			env = append(env, kv)
		}
	}
	cmd.Env = append(env, "PATH="+pyDir+string(os.PathListSeparator)+os.Getenv("PATH"))
	// Its own process group: whatever the page started in the background
	// is killed with it, also when a step fails halfway.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	logPath := filepath.Join(t.TempDir(), "walkthrough.log")
	logFile, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	defer logFile.Close()
	cmd.Stdout, cmd.Stderr = logFile, logFile
	start := time.Now()
	runErr := cmd.Run()
	if cmd.Process != nil {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	}
	out, _ := os.ReadFile(logPath)
	if runErr != nil {
		for _, l := range []string{"adopt-rocketrides", "adopt-enqueuer", "adopt-completer", "adopt-orders-api", "adopt-completer-py"} {
			if b, err := os.ReadFile(filepath.Join(root, "bin", l+".log")); err == nil {
				t.Logf("--- bin/%s.log (tail):\n%s", l, tail(string(b), 3000))
			}
		}
		t.Fatalf("%s's commands failed after %s: %v\n%s", page, time.Since(start).Round(time.Second), runErr, out)
	}
	// What the page prints, checked beside its own exit-status checks.
	for _, want := range []string{
		`idemd_completer_replays_total{outcome="finished"}`,
		"send_ride_receipt|completed|",
		"finished|201",
	} {
		if !strings.Contains(string(out), want) {
			t.Errorf("the walkthrough's output lacks %q:\n%s", want, out)
		}
	}
	t.Logf("%s ran in %s", page, time.Since(start).Round(time.Second))
}

// TestCommandsExtraction: the extraction takes exactly the marked blocks.
func TestCommandsExtraction(t *testing.T) {
	text := "intro\n```sh walkthrough\necho one\n```\n```sh\necho not run\n```\n```console\n$ no\n```\n" +
		strings.Repeat("```sh walkthrough\necho more\n```\n", 5)
	got := commands(t, text)
	if len(got) != 6 || got[0] != "echo one\n" || got[1] != "echo more\n" {
		t.Fatalf("commands = %q", got)
	}
}

// needServer: the page uses PostgreSQL on 127.0.0.1:5432 as
// scripts/ensure-postgres.sh sets it up.
func needServer(t *testing.T) {
	t.Helper()
	c, err := net.DialTimeout("tcp", "127.0.0.1:5432", 2*time.Second)
	if err != nil {
		missing(t, "no PostgreSQL on 127.0.0.1:5432 (scripts/ensure-postgres.sh)")
		return
	}
	c.Close()
}

// missing fails under CI=true and skips elsewhere.
func missing(t *testing.T, what string) {
	t.Helper()
	if os.Getenv("CI") == "true" {
		t.Fatal(what)
	}
	t.Skip(what)
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}
