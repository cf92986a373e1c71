package daemon_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemd/idemd/internal/buildinfo"
	"github.com/idemd/idemd/internal/completer"
	"github.com/idemd/idemd/internal/config"
	"github.com/idemd/idemd/internal/ctl"
	"github.com/idemd/idemd/internal/daemon"
	"github.com/idemd/idemd/internal/enqueuer"
	"github.com/idemd/idemd/internal/migrate"
	"github.com/idemd/idemd/internal/reaper"
	"github.com/idemd/idemd/internal/testing/dbtest"
)

// floorCmd is a long-running command that runs on schemas from oldest up,
// and tells the test where its ops server listens.
type floorCmd struct {
	config.Common `embed:""`
	oldest        int64
	addr          chan string
	stop          chan struct{}
}

func (c *floorCmd) CommonConfig() *config.Common { return &c.Common }
func (c *floorCmd) LongRunning() bool            { return true }
func (c *floorCmd) OldestSchema() int64          { return c.oldest }
func (c *floorCmd) Run(ctx context.Context, env *daemon.Env) error {
	c.addr <- env.OpsAddr
	select {
	case <-ctx.Done():
	case <-c.stop:
	}
	return nil
}

// Every daemon's /metrics has idemd_build_info and the schema gauges, and
// /readyz says when the database is newer than the binary (ready, safe) or
// lacks a migration the command needs (not ready, `idemctl migrate`).
func TestVersionsOnOpsEndpoints(t *testing.T) {
	ctx := context.Background()
	dbURL := dbtest.NewDatabase(t)
	admin, err := pgx.Connect(ctx, dbtest.AdminURL(t, dbURL))
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)

	const oldest = 11
	cmd := &floorCmd{oldest: oldest, addr: make(chan string, 1), stop: make(chan struct{})}
	done := make(chan int, 1)
	go func() {
		done <- daemon.MainWith("floor", "", cmd, []string{"--database-url", dbURL, "--http-addr", "127.0.0.1:0", "--log-level", "error"}, io.Discard, io.Discard)
	}()
	var addr string
	select {
	case addr = <-cmd.addr:
	case code := <-done:
		t.Fatalf("MainWith exited %d before running the command", code)
	case <-time.After(time.Minute):
		t.Fatal("the command did not start")
	}
	defer func() {
		close(cmd.stop)
		if code := <-done; code != daemon.ExitOK {
			t.Errorf("exit %d", code)
		}
	}()
	get := func(path string) (int, string) {
		t.Helper()
		resp, err := http.Get("http://" + addr + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body)
	}

	if code, body := get("/readyz"); code != http.StatusOK || body != "ok\n" {
		t.Errorf("at the head: /readyz %d %q", code, body)
	}
	newest := migrate.Newest()
	if _, err := admin.Exec(ctx, "INSERT INTO "+migrate.VersionTable+" (version_id, is_applied) VALUES ($1, true)", newest+1); err != nil {
		t.Fatal(err)
	}
	if code, body := get("/readyz"); code != http.StatusOK || !strings.HasPrefix(body, "ok\nnote: ") || !strings.Contains(body, "newer than this binary") {
		t.Errorf("one migration ahead: /readyz %d %q, want ok with a note", code, body)
	}
	_, metrics := get("/metrics")
	for _, want := range []string{
		fmt.Sprintf(`idemd_build_info{commit=%q,goversion=%q,service="floor",version=%q} 1`, buildinfo.Commit(), buildinfo.GoVersion(), buildinfo.Version()),
		fmt.Sprintf(`idemd_schema_version{of="database"} %d`, newest+1),
		fmt.Sprintf(`idemd_schema_version{of="binary_newest"} %d`, newest),
		fmt.Sprintf(`idemd_schema_version{of="binary_oldest"} %d`, oldest),
		"idemd_schema_newer_than_binary 1",
	} {
		if !strings.Contains(metrics, "\n"+want+"\n") {
			t.Errorf("/metrics lacks %s", want)
		}
	}

	// A migration above the command's oldest schema may be missing...
	if _, err := admin.Exec(ctx, "DELETE FROM "+migrate.VersionTable+" WHERE version_id = $1", oldest+1); err != nil {
		t.Fatal(err)
	}
	if code, body := get("/readyz"); code != http.StatusOK {
		t.Errorf("migration %d missing, oldest schema %d: /readyz %d %q, want ready", oldest+1, oldest, code, body)
	}
	// ...one at or below it may not.
	if _, err := admin.Exec(ctx, "DELETE FROM "+migrate.VersionTable+" WHERE version_id = $1", oldest); err != nil {
		t.Fatal(err)
	}
	if code, body := get("/readyz"); code != http.StatusServiceUnavailable || !strings.Contains(body, "00011_idemd_leases.sql") || !strings.Contains(body, "idemctl migrate") {
		t.Errorf("migration %d missing: /readyz %d %q, want 503 naming it and idemctl migrate", oldest, code, body)
	}
}

// Each command's oldest schema is a migration its binary ships.
func TestOldestSchemas(t *testing.T) {
	for name, v := range map[string]int64{
		"enqueuer": enqueuer.OldestSchema, "completer": completer.OldestSchema,
		"reaper": reaper.OldestSchema, "idemctl": ctl.OldestSchema,
	} {
		if !migrate.Known(v) || v > migrate.Newest() {
			t.Errorf("%s: oldest schema %d is not a migration this binary ships (newest %d)", name, v, migrate.Newest())
		}
	}
}

// --version prints the command, version, commit and Go version and exits
// 0, on every command, without a database.
func TestVersionFlag(t *testing.T) {
	var out, errOut bytes.Buffer
	code := daemon.MainWith("enqueuer", "", &enqueuer.Command{}, []string{"--version"}, &out, &errOut)
	if want := buildinfo.Line("enqueuer") + "\n"; code != daemon.ExitOK || out.String() != want {
		t.Errorf("enqueuer --version: exit %d, stdout %q, want %q; stderr %q", code, out.String(), want, errOut.String())
	}
	out.Reset()
	errOut.Reset()
	code = ctl.Main([]string{"status", "--version"}, &out, &errOut)
	if want := buildinfo.Line("idemctl") + "\n"; code != daemon.ExitOK || out.String() != want {
		t.Errorf("idemctl status --version: exit %d, stdout %q, want %q; stderr %q", code, out.String(), want, errOut.String())
	}
}
