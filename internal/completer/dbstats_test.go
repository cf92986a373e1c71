package completer

import (
	"context"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap/zaptest"

	"github.com/idemd/idemd/internal/config"
	"github.com/idemd/idemd/internal/daemon"
	"github.com/idemd/idemd/internal/dbstats"
	"github.com/idemd/idemd/internal/testing/dbtest"
	"github.com/idemd/idemd/internal/testing/testwait"
)

// The exporter's flags default to dbstats.DefaultSettings, through the
// completer's FlagDefaults.
func TestDBStatsFlagDefaults(t *testing.T) {
	var c Command
	if _, err := config.Parse("completer", Description, &c, []string{
		"--database-url", "postgres://x@127.0.0.1:1/db", "--api-url", "http://api.example", "--auth-secret-file", writeSecret(t, testSecret),
	}, io.Discard); err != nil {
		t.Fatal(err)
	}
	if want := dbstats.DefaultSettings(); c.Stats != want {
		t.Fatalf("parsed exporter settings %+v, want dbstats.DefaultSettings %+v", c.Stats, want)
	}
	var bad Command
	_, err := config.Parse("completer", Description, &bad, []string{
		"--database-url", "postgres://x@127.0.0.1:1/db", "--api-url", "http://api.example", "--auth-secret-file", writeSecret(t, testSecret),
		"--db-stats-interval", "0s",
	}, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "--db-stats-interval must be positive") {
		t.Fatalf("--db-stats-interval 0s: %v", err)
	}
}

// TestLongRunningExportsDBStats: the long-running completer (Command.Run
// without --once) runs the database-wide gauges' exporter: River's queue
// depth and the reaper history's last complete run are exported, and when
// the run ends the exporter has stopped and released its lease.
func TestLongRunningExportsDBStats(t *testing.T) {
	dbURL := dbtest.NewDatabase(t)
	pool, err := pgxpool.New(t.Context(), dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	var reaperEnd time.Time
	if _, err := pool.Exec(t.Context(), `
INSERT INTO river_job (state, queue, kind, args, scheduled_at) VALUES ('available', 'default', 'test_kind', '{}', now())`); err != nil {
		t.Fatal(err)
	}
	if err := pool.QueryRow(t.Context(), `
INSERT INTO idemd_reaper_runs (started_at, finished_at, mode, result, holder)
VALUES (now() - interval '1 hour', now() - interval '1 hour' + interval '2 seconds', 'once', 'complete', 'reaper/cronjob-pod/1/aa')
RETURNING finished_at`).Scan(&reaperEnd); err != nil {
		t.Fatal(err)
	}

	var c Command
	if _, err := config.Parse("completer", Description, &c, []string{
		"--database-url", dbURL, "--api-url", "http://127.0.0.1:1", "--auth-secret-file", writeSecret(t, testSecret),
		"--shutdown-timeout", "30s",
	}, io.Discard); err != nil {
		t.Fatal(err)
	}
	if !c.LongRunning() {
		t.Fatal("the command is not long-running")
	}
	reg := prometheus.NewRegistry()
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	done := make(chan error, 1)
	go func() {
		done <- c.Run(ctx, &daemon.Env{Name: "completer", Logger: zaptest.NewLogger(t), Pool: pool, Registry: reg})
	}()

	sample := func(name, labels string) (float64, bool) {
		fams, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range fams {
			if f.GetName() != name {
				continue
			}
			for _, m := range f.GetMetric() {
				got := ""
				for _, l := range m.GetLabel() {
					got += fmt.Sprintf("%s=%s,", l.GetName(), l.GetValue())
				}
				if got == labels {
					return m.GetGauge().GetValue(), true
				}
			}
		}
		return 0, false
	}
	testwait.Until(t, time.Minute, "the completer to export the database-wide gauges", func() bool {
		_, ok := sample("idemd_reaper_history_last_success_timestamp_seconds", "")
		return ok
	})
	if v, _ := sample("idemd_reaper_history_last_success_timestamp_seconds", ""); v != float64(reaperEnd.UnixNano())/1e9 {
		t.Errorf("idemd_reaper_history_last_success_timestamp_seconds = %v, want the reaper run's end %v", v, float64(reaperEnd.UnixNano())/1e9)
	}
	if v, ok := sample("idemd_river_jobs", "queue=default,state=available,"); !ok || v != 1 {
		t.Errorf("idemd_river_jobs{queue=default,state=available} = %v (exported %v), want 1", v, ok)
	}
	if v, _ := sample("idemd_dbstats_exporter", ""); v != 1 {
		t.Errorf("idemd_dbstats_exporter = %v, want 1", v)
	}

	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("Run did not return after its context ended")
	}
	if v, ok := sample("idemd_dbstats_exporter", ""); !ok || v != 0 {
		t.Errorf("after Run: idemd_dbstats_exporter = %v (exported %v), want 0", v, ok)
	}
	var leases int
	if err := pool.QueryRow(context.Background(), "SELECT count(*) FROM idemd_leases WHERE name = $1", dbstats.LeaseName).Scan(&leases); err != nil {
		t.Fatal(err)
	}
	if leases != 0 {
		t.Errorf("the exporter's lease is still held after Run returned")
	}
}
