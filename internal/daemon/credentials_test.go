package daemon_test

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemd/idemd/internal/ctl"
	"github.com/idemd/idemd/internal/testing/dbtest"
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
// role's password is changed in place while it runs, and its sessions
// terminated before the file is rewritten: the window every in-place
// rotation has. New connections are refused in it, counted in
// idemd_database_auth_failures_total and logged once; once the file holds
// the new password, the enqueuer reconnects, says once that the
// credentials changed and once that they are accepted again, keeps moving
// staged jobs, and never logs either password. idemctl reads the same file.
func TestPasswordFileRotation(t *testing.T) {
	ctx := context.Background()
	c, dbURL, adminPool := rotationDatabase(t, "idemd_rotate")

	// Passwords that cannot appear in a log by accident.
	const first, second = "rotate-first-Zq81xv", "rotate-second-Kp47wd"
	setPassword := func(pw string) {
		t.Helper()
		if _, err := adminPool.Exec(ctx, fmt.Sprintf("ALTER ROLE %s PASSWORD '%s'", pgx.Identifier{dbtest.RuntimeRole}.Sanitize(), pw)); err != nil {
			t.Fatal(err)
		}
	}
	setPassword(first)
	runtimeURL := dbtest.AsRole(dbURL, dbtest.RuntimeRole) // no password in it
	requirePasswords(t, c, runtimeURL)

	pwFile := filepath.Join(t.TempDir(), "password")
	writePasswordFile(t, pwFile, first)
	enq := startDaemon(t, "enqueuer", "--database-url", runtimeURL, "--database-password-file", pwFile)

	ready := func() bool {
		resp, err := http.Get("http://" + enq.addr + "/readyz")
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

	// Rotate in place, the file last: the role's password, then every
	// session the old password opened is terminated, so the enqueuer must
	// log in again while the file still holds the old password.
	setPassword(second)
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
	testwait.Until(t, time.Minute, "the enqueuer to count refused logins", func() bool {
		v, ok := enq.metric("idemd_database_auth_failures_total")
		return ok && v >= 2
	})
	writePasswordFile(t, pwFile, second)
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

	enq.stop(t)
	log := enq.logs.String()
	for _, pw := range []string{first, second} {
		if strings.Contains(log, pw) || strings.Contains(out.String()+errOut.String(), pw) {
			t.Errorf("a password appears in the output:\n%s", log)
		}
	}
	for msg, want := range map[string]int{
		"the database refused a new connection's credentials":     1,
		"the database accepts new connections' credentials again": 1,
		"the database credentials file changed":                   1,
	} {
		if n := strings.Count(log, msg); n != want {
			t.Errorf("the log says %d times %q, want %d:\n%s", n, msg, want, log)
		}
	}
}
