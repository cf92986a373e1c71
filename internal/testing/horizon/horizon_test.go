package horizon

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemd/idemd/internal/testing/dbtest"
	"github.com/idemd/idemd/internal/testing/testwait"
)

func TestMain(m *testing.M) { dbtest.Main(m) }

// session opens a connection to pool's database named app.
func session(t *testing.T, pool *pgxpool.Pool, app string) *pgx.Conn {
	t.Helper()
	cfg := pool.Config().ConnConfig.Copy()
	cfg.RuntimeParams["application_name"] = app
	conn, err := pgx.ConnectConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) }) //nolint:errcheck
	return conn
}

// The shape of the standby enqueuer's old wait: a statement blocked on an
// advisory lock holds its snapshot for as long as it waits. The sampler
// reports it as a violation, with the session's name and wait; an idle
// idemd session and another application's held snapshot are not
// violations, the latter only raises the horizon's age.
func TestSamplerCatchesAWaitThatHoldsASnapshot(t *testing.T) {
	ctx := context.Background()
	pool := dbtest.NewPool(t)
	holder := session(t, pool, "api-holder")
	waiter := session(t, pool, "idemd-waiter")
	idle := session(t, pool, "idemd-idle")
	if _, err := idle.Exec(ctx, "SELECT 1"); err != nil {
		t.Fatal(err)
	}
	api := session(t, pool, "api-long-tx")
	tx, err := api.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck
	if _, err := tx.Exec(ctx, "SELECT 1"); err != nil {
		t.Fatal(err)
	}
	const key = 471147
	if _, err := holder.Exec(ctx, "SELECT pg_advisory_lock($1)", key); err != nil {
		t.Fatal(err)
	}
	waited := make(chan error, 1)
	go func() {
		_, err := waiter.Exec(ctx, "SELECT pg_advisory_lock($1)", key)
		waited <- err
	}()

	s := Start(ctx, pool, Options{Interval: 20 * time.Millisecond, Bound: 200 * time.Millisecond})
	testwait.Until(t, time.Minute, "the waiting session reported", func() bool {
		rep := s.Snapshot()
		if rep.LastError != nil {
			t.Fatalf("sample: %v", rep.LastError)
		}
		return len(rep.Violations) > 0
	})
	if _, err := holder.Exec(ctx, "SELECT pg_advisory_unlock($1)", key); err != nil {
		t.Fatal(err)
	}
	if err := <-waited; err != nil {
		t.Fatal(err)
	}
	rep := s.Stop()
	if len(rep.Violations) != 1 {
		t.Fatalf("violations: %v, want the waiting session's alone", rep.Violations)
	}
	v := rep.Violations[0]
	if v.ApplicationName != "idemd-waiter" || v.WaitEvent != "Lock:advisory" || !strings.Contains(v.Query, "pg_advisory_lock") || v.Held <= 200*time.Millisecond {
		t.Fatalf("violation: %s", v)
	}
	if rep.Err() == nil {
		t.Fatal("a report with a violation is not an error")
	}
	if rep.LongestOtherHolder != "api-long-tx" && rep.LongestOtherHolder != "api-holder" {
		t.Fatalf("the longest other holder: %s", rep)
	}
	if rep.MaxHorizonAge < 0 || rep.MaxHorizonAgeHolder == "" {
		t.Fatalf("the horizon's holder was not recorded: %s", rep)
	}
}

// Short statements of idemd's sessions are no violation, however often
// they are sampled while they run.
func TestSamplerPassesShortStatements(t *testing.T) {
	ctx := context.Background()
	pool := dbtest.NewPool(t)
	busy := session(t, pool, "idemd-busy")
	s := Start(ctx, pool, Options{Interval: 5 * time.Millisecond, Bound: 10 * time.Second})
	testwait.Until(t, time.Minute, "a busy session seen holding a snapshot", func() bool {
		if _, err := busy.Exec(ctx, "SELECT pg_sleep(0.02)"); err != nil {
			t.Fatal(err)
		}
		return s.Snapshot().LongestIdemdHolder == "idemd-busy"
	})
	rep := s.Stop()
	if err := rep.Err(); err != nil {
		t.Fatal(err)
	}
	if rep.LongestIdemd <= 0 || rep.LongestIdemd > 10*time.Second {
		t.Fatalf("longest idemd snapshot %s", rep.LongestIdemd)
	}
}
