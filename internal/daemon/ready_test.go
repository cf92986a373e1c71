package daemon_test

import (
	"context"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemd/idemd/internal/migrate"
	"github.com/idemd/idemd/internal/testing/dbtest"
	"github.com/idemd/idemd/internal/testing/scratchdb"
	"github.com/idemd/idemd/internal/testing/testbin"
	"github.com/idemd/idemd/internal/testing/testwait"
)

// TestNotReadyUntilMigrated: daemons started on an empty database answer
// /readyz 503 naming the missing migrations (up to each one's oldest
// schema) and the fix, and become ready
// once `idemctl migrate` has run, without a restart; then a SIGTERM still
// ends them cleanly.
func TestNotReadyUntilMigrated(t *testing.T) {
	ctx := context.Background()
	dbURL, drop, err := scratchdb.Create(ctx, dbtest.ServerURL(t), "idemd_ready")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = drop(context.Background()) })
	secret := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(secret, []byte("c2VjcmV0LXNlY3JldC1zZWNyZXQtc2VjcmV0LXNlYw=="), 0o600); err != nil {
		t.Fatal(err)
	}

	type daemonProc struct {
		name, addr string
		missing    string // the newest migration its /readyz must name
		cmd        *exec.Cmd
		done       chan error
	}
	var procs []*daemonProc
	for _, d := range []struct {
		name, pkg, missing string
		args               []string
	}{
		{"enqueuer", "github.com/idemd/idemd/cmd/enqueuer", "00003_staged_jobs.sql", nil},
		{"completer", "github.com/idemd/idemd/cmd/completer", "00016_idemd_reaper_runs.sql", []string{"--api-url", "http://127.0.0.1:1", "--auth-secret-file", secret}},
	} {
		addr := closedAddr(t)
		cmd := exec.Command(testbin.Build(t, d.pkg), append(d.args, "--database-url", dbURL, "--http-addr", addr)...)
		cmd.Stderr = io.Discard
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		p := &daemonProc{name: d.name, addr: addr, missing: d.missing, cmd: cmd, done: make(chan error, 1)}
		go func() { p.done <- cmd.Wait() }()
		t.Cleanup(func() { _ = cmd.Process.Kill() })
		procs = append(procs, p)
	}

	readyz := func(addr string) (int, string) {
		resp, err := http.Get("http://" + addr + "/readyz")
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body)
	}
	for _, p := range procs {
		testwait.Until(t, time.Minute, p.name+" to say the schema is missing", func() bool {
			code, body := readyz(p.addr)
			return code == http.StatusServiceUnavailable && strings.Contains(body, "idemctl migrate") && strings.Contains(body, p.missing)
		})
	}

	pool, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if _, err := migrate.Up(ctx, pool, migrate.Options{}); err != nil {
		t.Fatal(err)
	}
	for _, p := range procs {
		testwait.Until(t, time.Minute, p.name+" to become ready after the migration", func() bool {
			code, _ := readyz(p.addr)
			return code == http.StatusOK
		})
	}
	for _, p := range procs {
		if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		select {
		case err := <-p.done:
			if err != nil {
				t.Fatalf("%s on SIGTERM: %v", p.name, err)
			}
		case <-time.After(time.Minute):
			t.Fatalf("%s did not exit on SIGTERM", p.name)
		}
	}
}
