package daemon_test

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemd/idemd/internal/ctl"
	"github.com/idemd/idemd/internal/migrate"
	"github.com/idemd/idemd/internal/testing/dbtest"
	"github.com/idemd/idemd/internal/testing/testbin"
	"github.com/idemd/idemd/internal/testing/testwait"
)

// lockedBuffer is a process's stderr, read while the process writes it.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// writePasswordFile replaces path's content the way the kubelet and Vault
// agent do: a new file renamed over the old one, so a reader never sees it
// half written.
func writePasswordFile(t *testing.T, path, password string) {
	t.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(password+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// TestPasswordFileRotation: an enqueuer whose role authenticates with
// scram-sha-256 reads its password from --database-password-file. The
// role's password is changed and the file rewritten while it runs; its
// sessions are terminated; it reconnects with the new password and keeps
// moving staged jobs, says once that the file changed, and never logs
// either password. idemctl reads the same file.
func TestPasswordFileRotation(t *testing.T) {
	ctx := context.Background()
	c := dbtest.StartCluster(t)
	admin, err := pgx.Connect(ctx, c.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
	if _, err := admin.Exec(ctx, "CREATE DATABASE idemd_rotate"); err != nil {
		t.Fatal(err)
	}
	dbURL := dbtest.WithDatabase(c.URL(), "idemd_rotate")
	if err := dbtest.ApplyRoles(ctx, dbURL); err != nil {
		t.Fatal(err)
	}
	adminPool, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer adminPool.Close()
	// As in production, the migrator owns the schema and grants the
	// runtime role its privileges (still trusted: passwords come next).
	migrator, err := pgxpool.New(ctx, dbtest.AsRole(dbURL, dbtest.MigratorRole))
	if err != nil {
		t.Fatal(err)
	}
	_, err = migrate.Up(ctx, migrator, migrate.Options{})
	migrator.Close()
	if err != nil {
		t.Fatal(err)
	}

	// Passwords that cannot appear in a log by accident.
	const first, second = "rotate-first-Zq81xv", "rotate-second-Kp47wd"
	setPassword := func(pw string) {
		t.Helper()
		if _, err := adminPool.Exec(ctx, fmt.Sprintf("ALTER ROLE %s PASSWORD '%s'", pgx.Identifier{dbtest.RuntimeRole}.Sanitize(), pw)); err != nil {
			t.Fatal(err)
		}
	}
	setPassword(first)
	if err := c.RequirePasswords(); err != nil {
		t.Fatal(err)
	}
	runtimeURL := dbtest.AsRole(dbURL, dbtest.RuntimeRole) // no password in it
	testwait.Until(t, time.Minute, "the server to refuse a login without a password", func() bool {
		conn, err := pgx.Connect(ctx, runtimeURL)
		if err == nil {
			conn.Close(ctx)
			return false
		}
		return strings.Contains(err.Error(), "password")
	})

	pwFile := filepath.Join(t.TempDir(), "password")
	writePasswordFile(t, pwFile, first)
	addr := closedAddr(t)
	var logs lockedBuffer
	cmd := exec.Command(testbin.Build(t, "github.com/idemd/idemd/cmd/enqueuer"),
		"--database-url", runtimeURL, "--database-password-file", pwFile, "--http-addr", addr, "--log-format", "json")
	cmd.Stderr = &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		if t.Failed() {
			t.Logf("enqueuer log:\n%s", logs.String())
		}
	})

	ready := func() bool {
		resp, err := http.Get("http://" + addr + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}
	staged := 0
	moves := func(what string) {
		t.Helper()
		staged++
		if _, err := adminPool.Exec(ctx, `INSERT INTO staged_jobs (job_name, job_args) VALUES ('rotate', jsonb_build_object('i', $1::int))`, staged); err != nil {
			t.Fatal(err)
		}
		testwait.Until(t, time.Minute, what, func() bool {
			var n int
			if err := adminPool.QueryRow(ctx, `SELECT count(*) FROM river_job WHERE kind = 'rotate'`).Scan(&n); err != nil {
				t.Fatal(err)
			}
			return n == staged
		})
	}
	testwait.Until(t, time.Minute, "the enqueuer to become ready with the file's password", ready)
	moves("the enqueuer to move a job with the first password")

	// Rotate: the role's password, then the file, then every session the
	// old password opened is terminated.
	setPassword(second)
	writePasswordFile(t, pwFile, second)
	if conn, err := pgx.Connect(ctx, runtimeURL+"&password="+first); err == nil {
		conn.Close(ctx)
		t.Fatal("the old password still logs in: the rotation tests nothing")
	}
	var killed int
	if err := adminPool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity WHERE usename = $1`, dbtest.RuntimeRole).Scan(&killed); err != nil {
		t.Fatal(err)
	}
	if killed == 0 {
		t.Fatal("the enqueuer had no session to terminate")
	}
	moves("the enqueuer to reconnect with the second password and move a job")
	testwait.Until(t, time.Minute, "the enqueuer to be ready again", ready)
	var sessions int
	if err := adminPool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE usename = $1`, dbtest.RuntimeRole).Scan(&sessions); err != nil {
		t.Fatal(err)
	}
	if sessions == 0 {
		t.Error("the enqueuer holds no session after the rotation")
	}

	// idemctl builds its pool the same way.
	var out, errOut bytes.Buffer
	if code := ctl.Main([]string{"status", "--database-url", runtimeURL, "--database-password-file", pwFile, "--log-format", "json"}, &out, &errOut); code != 0 {
		t.Errorf("idemctl status with the rotated file: exit %d\n%s%s", code, out.String(), errOut.String())
	}

	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("enqueuer on SIGTERM: %v", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("the enqueuer did not exit on SIGTERM")
	}
	log := logs.String()
	for _, pw := range []string{first, second} {
		if strings.Contains(log, pw) || strings.Contains(out.String()+errOut.String(), pw) {
			t.Errorf("a password appears in the output:\n%s", log)
		}
	}
	// The sessions the kill ended fail what they were doing; no new
	// connection may have tried the stale password.
	if strings.Contains(log, "password authentication failed") {
		t.Errorf("a connection authenticated with a stale password:\n%s", log)
	}
	if n := strings.Count(log, "the database password file changed"); n != 1 {
		t.Errorf("the log says %d times that the password file changed, want once:\n%s", n, log)
	}
}
