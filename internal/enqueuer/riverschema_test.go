package enqueuer

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"

	"github.com/idemd/idemd/internal/migrate"
	"github.com/idemd/idemd/internal/opshttp"
	"github.com/idemd/idemd/internal/testing/dbtest"
)

// The newest River schema the River module ships is one the move writes:
// a River upgrade that adds a migration fails here until the move is
// tested against it and migrate.RiverSchemaVersions names it.
func TestRiverSchemaVersions(t *testing.T) {
	m, err := rivermigrate.New(riverpgxv5.New(nil), nil)
	if err != nil {
		t.Fatal(err)
	}
	all := m.AllVersions()
	newest := all[len(all)-1].Version
	if riverNewest != newest {
		t.Fatalf("River's newest schema version is %d; migrate.RiverSchemaVersions %v ends at %d", newest, migrate.RiverSchemaVersions, riverNewest)
	}
	if len(migrate.RiverSchemaVersions) < 2 || migrate.RiverSchemaVersions[len(migrate.RiverSchemaVersions)-2] != newest-1 {
		t.Fatalf("migrate.RiverSchemaVersions %v must hold River's previous schema version %d", migrate.RiverSchemaVersions, newest-1)
	}
}

// gateService is an enqueuer with its readiness, as the daemon gives it.
func gateService(t *testing.T, pool *pgxpool.Pool) (*Service, *opshttp.Readiness) {
	t.Helper()
	ready := &opshttp.Readiness{}
	s := newService(t, pool)
	s.cfg.Ready = ready
	ready.Blocked = s.blocked
	return s, ready
}

func stageN(t *testing.T, pool *pgxpool.Pool, n int) {
	t.Helper()
	if _, err := pool.Exec(context.Background(), `INSERT INTO staged_jobs (job_name, job_args) SELECT 'k', jsonb_build_object('n', g) FROM generate_series(1, $1::int) g`, n); err != nil {
		t.Fatal(err)
	}
}

// On a River schema version it was not tested with, or a river_job that
// differs from River's, the enqueuer moves nothing and dead-letters
// nothing: the rows wait staged, /readyz and the gauge say why, and the
// first batch after the schema is put right moves them.
func TestRiverSchemaGate(t *testing.T) {
	ctx := context.Background()
	pool := dbtest.NewPool(t)
	migrator := dbtest.MigratorPool(t, pool)
	s, ready := gateService(t, pool)
	exec := func(sql string) {
		t.Helper()
		if _, err := migrator.Exec(ctx, sql); err != nil {
			t.Fatal(err)
		}
	}
	refused := func(what, reason string) {
		t.Helper()
		stageN(t, pool, 3)
		if _, err := s.RunOnce(ctx); !errors.Is(err, errRiverSchema) || !strings.Contains(err.Error(), reason) {
			t.Fatalf("%s: RunOnce: %v, want errRiverSchema saying %q", what, err, reason)
		}
		if n := count(t, pool, `SELECT count(*) FROM staged_jobs`); n != 3 {
			t.Fatalf("%s: %d rows staged, want all 3", what, n)
		}
		if n := count(t, pool, `SELECT count(*) FROM staged_jobs_dead`); n != 0 {
			t.Fatalf("%s: %d rows dead-lettered", what, n)
		}
		if err := ready.Blocked(); err == nil || !strings.Contains(err.Error(), reason) {
			t.Fatalf("%s: /readyz's check: %v, want the reason %q", what, err, reason)
		}
		if v := testutil.ToFloat64(s.metrics.riverSchemaSupported); v != 0 {
			t.Fatalf("%s: idemd_enqueuer_river_schema_supported = %v", what, v)
		}
	}
	moves := func(what string) {
		t.Helper()
		res, err := s.RunOnce(ctx)
		if err != nil || res.Moved != 3 {
			t.Fatalf("%s: RunOnce: %+v, %v; want the 3 rows moved", what, res, err)
		}
		if err := ready.Blocked(); err != nil {
			t.Fatalf("%s: /readyz's check: %v", what, err)
		}
		if v := testutil.ToFloat64(s.metrics.riverSchemaSupported); v != 1 {
			t.Fatalf("%s: idemd_enqueuer_river_schema_supported = %v", what, v)
		}
	}

	// A newer River recorded (the API ran a River release's migration):
	// the gate's cached verdict is stale, and the move's own comparison
	// catches it.
	stageN(t, pool, 1)
	if res, err := s.RunOnce(ctx); err != nil || res.Moved != 1 {
		t.Fatalf("current schema: %+v, %v", res, err)
	}
	exec(`INSERT INTO river_migration (line, version) VALUES ('main', 99)`)
	stageN(t, pool, 3)
	if _, err := s.RunOnce(ctx); !errors.Is(err, errRiverSchema) {
		t.Fatalf("first move after River's version changed: %v, want errRiverSchema", err)
	}
	if n := count(t, pool, `SELECT count(*) FROM staged_jobs`); n != 3 {
		t.Fatalf("%d rows staged after the move found the version changed, want 3", n)
	}
	if _, err := pool.Exec(ctx, `DELETE FROM staged_jobs`); err != nil {
		t.Fatal(err)
	}
	refused("newer", "version 99, newer")
	exec(`DELETE FROM river_migration WHERE version = 99`)
	moves("back at the current version")

	// A NOT NULL column without a default, added by hand: the version is
	// River's, the table is not.
	exec(`ALTER TABLE river_job ADD COLUMN tenant int NOT NULL DEFAULT 0`)
	exec(`ALTER TABLE river_job ALTER COLUMN tenant DROP DEFAULT`)
	s.riverGate.invalidate()
	refused("drifted", "tenant is NOT NULL")
	exec(`ALTER TABLE river_job DROP COLUMN tenant`)
	moves("drift removed")
}

// The API may run River one schema behind idemd's River: at River's
// previous version the move writes the job River's client writes, and
// when the API then upgrades River under a running enqueuer, the first
// move after the migration sees it, reads the schema again and goes on. On
// an older schema still, it refuses.
func TestRiverPreviousSchemaAndUpgrade(t *testing.T) {
	ctx := context.Background()
	pool := dbtest.NewPool(t)
	migrator := dbtest.MigratorPool(t, pool)
	rm, err := rivermigrate.New(riverpgxv5.New(migrator), nil)
	if err != nil {
		t.Fatal(err)
	}
	previous := migrate.RiverSchemaVersions[len(migrate.RiverSchemaVersions)-2]
	if _, err := rm.Migrate(ctx, rivermigrate.DirectionDown, &rivermigrate.MigrateOpts{TargetVersion: previous}); err != nil {
		t.Fatal(err)
	}
	s, _ := gateService(t, pool)
	assertGoAndServerMovesAgree(t, s, pool)
	if v := testutil.ToFloat64(s.metrics.riverSchemaVersion); v != float64(previous) {
		t.Fatalf("river schema version gauge %v, want %d", v, previous)
	}

	if _, err := rm.Migrate(ctx, rivermigrate.DirectionUp, nil); err != nil {
		t.Fatal(err)
	}
	stageN(t, pool, 3)
	if _, err := s.RunOnce(ctx); !errors.Is(err, errRiverSchema) {
		t.Fatalf("the first move after River's upgrade: %v, want errRiverSchema (the version changed under it)", err)
	}
	res, err := s.RunOnce(ctx)
	if err != nil || res.Moved != 3 {
		t.Fatalf("after River's upgrade: %+v, %v", res, err)
	}
	if v := testutil.ToFloat64(s.metrics.riverSchemaVersion); v != float64(riverNewest) {
		t.Fatalf("river schema version gauge %v, want %d", v, riverNewest)
	}
	assertRiverReadsEveryJob(ctx, t, pool)

	// Older than any known version: refused, nothing moved.
	if _, err := rm.Migrate(ctx, rivermigrate.DirectionDown, &rivermigrate.MigrateOpts{TargetVersion: migrate.RiverSchemaVersions[0] - 1}); err != nil {
		t.Fatal(err)
	}
	stageN(t, pool, 2)
	s2, _ := gateService(t, pool)
	if _, err := s2.RunOnce(ctx); !errors.Is(err, errRiverSchema) || !strings.Contains(err.Error(), "older") {
		t.Fatalf("older River schema: %v, want errRiverSchema saying older", err)
	}
	if n := count(t, pool, `SELECT count(*) FROM staged_jobs`); n != 2 {
		t.Fatalf("%d rows staged on an older River schema, want 2", n)
	}
}

// A trigger on river_job that drops inserts (BEFORE INSERT ... RETURN
// NULL) would make staged rows vanish: neither a River job nor a dead row.
// The move checks inside its statement that it wrote a job for every row
// it took, so the batch fails instead and the rows stay staged.
func TestMoveChecksItWroteEveryJob(t *testing.T) {
	ctx := context.Background()
	pool := dbtest.NewPool(t)
	if _, err := dbtest.MigratorPool(t, pool).Exec(ctx, `
CREATE FUNCTION drop_odd_jobs() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF (NEW.args->>'n')::int % 2 = 1 THEN RETURN NULL; END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER drop_odd_jobs BEFORE INSERT ON river_job FOR EACH ROW EXECUTE FUNCTION drop_odd_jobs()`); err != nil {
		t.Fatal(err)
	}
	stageN(t, pool, 2)
	s := newService(t, pool)
	_, err := s.RunOnce(ctx)
	if err == nil || !strings.Contains(err.Error(), "2 staged rows taken but 1 River jobs written") {
		t.Fatalf("RunOnce with a trigger dropping an insert: %v", err)
	}
	if n := count(t, pool, `SELECT count(*) FROM staged_jobs`); n != 2 {
		t.Fatalf("%d rows staged, want both", n)
	}
	if n := count(t, pool, `SELECT count(*) FROM river_job`) + count(t, pool, `SELECT count(*) FROM staged_jobs_dead`); n != 0 {
		t.Fatalf("%d River jobs or dead rows, want none", n)
	}
}

// River's table refusing every row of a batch with one SQLSTATE is a fault
// of the table (here a CHECK constraint no row can meet), not of the rows:
// the batch fails loudly and nothing is dead-lettered. Rows it refuses
// among rows it takes are dead-lettered alone
// (TestRowsRiverRejectsAreDeadLetteredAlone).
func TestTableFaultIsNotDeadLettered(t *testing.T) {
	ctx := context.Background()
	pool := dbtest.NewPool(t)
	if _, err := dbtest.MigratorPool(t, pool).Exec(ctx, `ALTER TABLE river_job ADD CONSTRAINT no_k CHECK (kind <> 'k')`); err != nil {
		t.Fatal(err)
	}
	stageN(t, pool, 3)
	s := newService(t, pool)
	_, err := s.RunOnce(ctx)
	if err == nil || !strings.Contains(err.Error(), "refused all 3 rows of the batch with SQLSTATE 23514") {
		t.Fatalf("RunOnce: %v, want the batch failed as the table's fault", err)
	}
	if n := count(t, pool, `SELECT count(*) FROM staged_jobs`); n != 3 {
		t.Fatalf("%d rows staged, want all 3", n)
	}
	if n := count(t, pool, `SELECT count(*) FROM staged_jobs_dead`); n != 0 {
		t.Fatalf("%d rows dead-lettered, want none", n)
	}
}
