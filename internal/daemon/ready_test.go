package daemon_test

import (
	"context"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemd/idemd/internal/migrate"
	"github.com/idemd/idemd/internal/testing/dbtest"
	"github.com/idemd/idemd/internal/testing/scratchdb"
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
		*daemonProcess
		missing string // the newest migration its /readyz must name
	}
	var procs []daemonProc
	for _, d := range []struct {
		name, missing string
		args          []string
	}{
		{"enqueuer", "00003_staged_jobs.sql", nil},
		{"completer", "00016_idemd_reaper_runs.sql", []string{"--api-url", "http://127.0.0.1:1", "--auth-secret-file", secret}},
	} {
		procs = append(procs, daemonProc{startDaemon(t, d.name, append(d.args, "--database-url", dbURL)...), d.missing})
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
		p.stop(t)
	}
}
