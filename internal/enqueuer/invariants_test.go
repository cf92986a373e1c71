package enqueuer

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/idemd/idemd/internal/opshttp"
	"github.com/idemd/idemd/internal/riverdb"
	"github.com/idemd/idemd/internal/testing/dbtest"
)

// dropKind installs a BEFORE INSERT trigger on river_job that drops
// (RETURN NULL) every job of the kind: the insert reports no error, and
// the job is not written.
func dropKind(t *testing.T, pool *pgxpool.Pool, kind string) {
	t.Helper()
	if _, err := dbtest.MigratorPool(t, pool).Exec(context.Background(), fmt.Sprintf(`
CREATE FUNCTION drop_kind() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.kind = %s THEN RETURN NULL; END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER drop_kind BEFORE INSERT ON river_job FOR EACH ROW EXECUTE FUNCTION drop_kind()`, quoteLiteral(kind))); err != nil {
		t.Fatal(err)
	}
}

func quoteLiteral(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

// tally is the SQL oracle: rows staged, River jobs from staged rows, and
// dead rows.
type tally struct{ staged, river, dead int64 }

func tallyOf(t *testing.T, pool *pgxpool.Pool) tally {
	t.Helper()
	return tally{
		staged: count(t, pool, `SELECT count(*) FROM staged_jobs`),
		river:  count(t, pool, `SELECT count(*) FROM river_job WHERE metadata ? 'idemd_staged_id'`),
		dead:   count(t, pool, `SELECT count(*) FROM staged_jobs_dead`),
	}
}

// refusedAtOnce: the enqueuer's first failed batch left every row staged
// and dead-lettered none, and /readyz, the gauge and the counter say why
// at once, naming want.
func refusedAtOnce(t *testing.T, s *Service, ready *opshttp.Readiness, pool *pgxpool.Pool, staged int64, cause, want string) {
	t.Helper()
	if got := tallyOf(t, pool); got != (tally{staged: staged}) {
		t.Fatalf("after the refused batch: %+v, want all %d rows staged, none in River or dead-lettered", got, staged)
	}
	err := ready.Check(context.Background(), time.Now())
	if err == nil || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "fix:") {
		t.Fatalf("/readyz after the first refused batch: %v, want not ready naming %q and the fix", err, want)
	}
	if v := testutil.ToFloat64(s.metrics.refused); v != 1 {
		t.Fatalf("idemd_enqueuer_move_refused = %v, want 1", v)
	}
	if v := testutil.ToFloat64(s.metrics.refusals.WithLabelValues(cause)); v < 1 {
		t.Fatalf("idemd_enqueuer_move_refusals_total{cause=%q} = %v, want it counted", cause, v)
	}
}

// readyService is an enqueuer with its readiness as the daemon gives it,
// started (so /readyz's grace for a first pass has begun).
func readyService(t *testing.T, pool *pgxpool.Pool, change ...func(*Settings)) (*Service, *opshttp.Readiness) {
	t.Helper()
	ready := &opshttp.Readiness{}
	s := newService(t, pool, change...)
	s.cfg.Ready = ready
	ready.Blocked = s.blocked
	ready.MarkStarted(time.Now())
	return s, ready
}

// A trigger on river_job that drops inserts makes no row vanish on any
// path: the SQL path asserts it in its statement (idemd_move_check), the
// Go path (a batch with an invalid row) and its COPY (a batch of at least
// copyMinRows) count what River wrote. The batch fails and rolls back
// whole, the invalid row included, and nothing is dead-lettered.
func TestEveryPathKeepsRowsATriggerDrops(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name          string
		dropped, kept int
	}{
		{"sql", 2, 0},
		{"go", 2, 0},
		{"go with kept rows", 2, 3},
		{"copy", 35, 35},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pool := dbtest.NewPool(t)
			dropKind(t, pool, "dropped")
			if _, err := pool.Exec(ctx, `INSERT INTO staged_jobs (job_name, job_args) SELECT 'dropped', jsonb_build_object('n', g) FROM generate_series(1, $1::int) g`, tc.dropped); err != nil {
				t.Fatal(err)
			}
			stageN(t, pool, tc.kept)
			n := int64(tc.dropped + tc.kept)
			if tc.name != "sql" {
				// Invalid: the batch goes down the Go path.
				if _, err := pool.Exec(ctx, `INSERT INTO staged_jobs (job_name, job_args, priority) VALUES ('k', '{}', 9)`); err != nil {
					t.Fatal(err)
				}
				n++
			}
			if tc.name == "copy" && tc.dropped+tc.kept < copyMinRows {
				t.Fatalf("%d valid rows do not go through COPY (copyMinRows %d)", tc.dropped+tc.kept, copyMinRows)
			}
			s, ready := readyService(t, pool)
			_, err := s.RunOnce(ctx)
			if !errors.Is(err, errJobsDropped) && (err == nil || !strings.Contains(err.Error(), "River jobs written")) {
				t.Fatalf("RunOnce: %v, want the batch failed for the jobs River's table dropped", err)
			}
			refusedAtOnce(t, s, ready, pool, n, RefusalJobsDropped, "drops inserts")

			// Once the trigger is gone, the rows move and readiness is back.
			if _, err := dbtest.MigratorPool(t, pool).Exec(ctx, `DROP TRIGGER drop_kind ON river_job`); err != nil {
				t.Fatal(err)
			}
			if _, err := s.RunOnce(ctx); err != nil {
				t.Fatal(err)
			}
			want := tally{river: int64(tc.dropped + tc.kept), dead: n - int64(tc.dropped+tc.kept)}
			if got := tallyOf(t, pool); got != want {
				t.Fatalf("after the trigger was dropped: %+v, want %+v", got, want)
			}
			if err := ready.Check(ctx, time.Now()); err != nil {
				t.Fatalf("/readyz after a committed batch: %v", err)
			}
			if v := testutil.ToFloat64(s.metrics.refused); v != 0 {
				t.Fatalf("idemd_enqueuer_move_refused = %v after a committed batch", v)
			}
		})
	}
}

// A refusal that is River's table's and not the row's (a NOT NULL column
// added to river_job by hand, a CHECK constraint or trigger that refuses
// a known-good job too, a privilege revoked, the table missing) fails the
// batch even for a lone row: nothing is
// dead-lettered, /readyz says why and what to do after the first failed
// batch, and the row moves once the table is put right. The gate has
// already read the table (a first row moved): it would catch a NOT NULL
// column only at its next read, up to riverSchemaRecheck later.
func TestTableRefusalIsNeverTheLoneRowsFault(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name, breaks, fixes, cause, want string
	}{
		{"not null", `ALTER TABLE river_job ADD COLUMN tenant int NOT NULL DEFAULT 0; ALTER TABLE river_job ALTER COLUMN tenant DROP DEFAULT`,
			`ALTER TABLE river_job DROP COLUMN tenant`, RefusalTableRefused, "SQLSTATE 23502"},
		{"check on metadata", `ALTER TABLE river_job ADD CONSTRAINT has_tenant CHECK (metadata ? 'tenant') NOT VALID`,
			`ALTER TABLE river_job DROP CONSTRAINT has_tenant`, RefusalTableRefused, "SQLSTATE 23514"},
		{"check on args", `ALTER TABLE river_job ADD CONSTRAINT has_tenant CHECK (args ? 'tenant') NOT VALID`,
			`ALTER TABLE river_job DROP CONSTRAINT has_tenant`, RefusalTableRefused, "SQLSTATE 23514"},
		{"trigger raising a data exception", `
CREATE FUNCTION refuse_all() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN RAISE EXCEPTION 'no jobs today' USING ERRCODE = '22023'; END $$;
CREATE TRIGGER refuse_all BEFORE INSERT ON river_job FOR EACH ROW EXECUTE FUNCTION refuse_all()`,
			`DROP TRIGGER refuse_all ON river_job`, RefusalTableRefused, "a known-good job is refused too"},
		{"insert revoked", `REVOKE INSERT ON river_job FROM idemd_runtime`,
			`GRANT INSERT ON river_job TO idemd_runtime`, RefusalPermission, "river-grants.sql"},
		{"river_migration unreadable", `REVOKE SELECT ON river_migration FROM idemd_runtime`,
			`GRANT SELECT ON river_migration TO idemd_runtime`, RefusalPermission, "river-grants.sql"},
		{"river_job missing", `ALTER TABLE river_job RENAME TO river_job_away`,
			`ALTER TABLE river_job_away RENAME TO river_job`, RefusalRelationMissing, "idemctl migrate"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pool := dbtest.NewPool(t)
			migrator := dbtest.MigratorPool(t, pool)
			s, ready := readyService(t, pool)
			stageN(t, pool, 1)
			if res, err := s.RunOnce(ctx); err != nil || res.Moved != 1 {
				t.Fatalf("first row: %+v, %v", res, err)
			}
			if _, err := migrator.Exec(ctx, tc.breaks); err != nil {
				t.Fatal(err)
			}
			stageN(t, pool, 1)
			if _, err := s.RunOnce(ctx); err == nil {
				t.Fatal("RunOnce moved a lone row River's table refuses")
			}
			if n := count(t, pool, `SELECT count(*) FROM staged_jobs_dead`); n != 0 {
				t.Fatalf("%d rows dead-lettered for the table's refusal", n)
			}
			if n := count(t, pool, `SELECT count(*) FROM staged_jobs`); n != 1 {
				t.Fatalf("%d rows staged, want the lone row", n)
			}
			err := ready.Check(ctx, time.Now())
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "fix:") {
				t.Fatalf("/readyz after the first refused batch: %v, want not ready naming %q and the fix", err, tc.want)
			}
			if v := testutil.ToFloat64(s.metrics.refusals.WithLabelValues(tc.cause)); v < 1 {
				t.Fatalf("idemd_enqueuer_move_refusals_total{cause=%q} = %v", tc.cause, v)
			}
			if _, err := migrator.Exec(ctx, tc.fixes); err != nil {
				t.Fatal(err)
			}
			if _, err := s.RunOnce(ctx); err != nil {
				t.Fatalf("after the table was put right: %v", err)
			}
			if got := tallyOf(t, pool); got != (tally{river: 2}) {
				t.Fatalf("after the table was put right: %+v, want both rows in River", got)
			}
			if err := ready.Check(ctx, time.Now()); err != nil {
				t.Fatalf("/readyz after a committed batch: %v", err)
			}
		})
	}
}

// A lone row River's table refuses for the row's own data (here a unique
// index added to river_job that it collides with) is still dead-lettered:
// a known-good job goes in, so the refusal is the row's. So is a CHECK
// that refuses some jobs and not others
// (TestRowsRiverRejectsAreDeadLetteredAlone).
func TestRowsOwnRefusalIsStillDeadLettered(t *testing.T) {
	ctx := context.Background()
	pool := dbtest.NewPool(t)
	if _, err := dbtest.MigratorPool(t, pool).Exec(ctx, `CREATE UNIQUE INDEX one_order ON river_job ((args->>'order'))`); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO staged_jobs (job_name, job_args) VALUES ('k', '{"order": 1}')`); err != nil {
		t.Fatal(err)
	}
	s := newService(t, pool)
	if _, err := s.RunOnce(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO staged_jobs (job_name, job_args) VALUES ('k', '{"order": 1}')`); err != nil {
		t.Fatal(err)
	}
	if _, err := s.RunOnce(ctx); err != nil {
		t.Fatalf("RunOnce: %v, want the colliding row dead-lettered", err)
	}
	if got := tallyOf(t, pool); got != (tally{river: 1, dead: 1}) {
		t.Fatalf("%+v, want the first row in River and the colliding one dead-lettered", got)
	}
	if n := count(t, pool, `SELECT count(*) FROM staged_jobs_dead WHERE reason LIKE 'rejected_by_river: %23505%'`); n != 1 {
		t.Fatalf("%d dead rows rejected_by_river with 23505", n)
	}
}

// An invalid staged row whose id is already in staged_jobs_dead (staged
// with an explicit id, or staged again under the id of an earlier dead
// letter) is dead-lettered beside the earlier one: both are kept, and the
// good rows behind it move.
func TestDeadLetterBesideAnEarlierDeadRowOfTheSameID(t *testing.T) {
	ctx := context.Background()
	pool := dbtest.NewPool(t)
	s := newService(t, pool)
	if _, err := pool.Exec(ctx, `INSERT INTO staged_jobs (id, job_name, job_args, priority) VALUES (1000000, 'k', '{"first": true}', 9)`); err != nil {
		t.Fatal(err)
	}
	if res, err := s.RunOnce(ctx); err != nil || res.DeadLettered != 1 {
		t.Fatalf("first dead letter: %+v, %v", res, err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO staged_jobs (id, job_name, job_args, priority) VALUES (1000000, 'k', '{"second": true}', 0)`); err != nil {
		t.Fatal(err)
	}
	stageN(t, pool, 3)
	res, err := s.RunOnce(ctx)
	if err != nil || res.DeadLettered != 1 || res.Moved != 3 {
		t.Fatalf("RunOnce: %+v, %v; want the second dead-lettered and the 3 good rows moved", res, err)
	}
	if got := tallyOf(t, pool); got != (tally{river: 3, dead: 2}) {
		t.Fatalf("%+v, want 3 in River and both dead letters of id 1000000 kept", got)
	}
	if n := count(t, pool, `SELECT count(*) FROM staged_jobs_dead WHERE id = 1000000 AND (job_args ? 'first' OR job_args ? 'second')`); n != 2 {
		t.Fatalf("%d dead rows of id 1000000 with their own args, want 2", n)
	}
}

// Three replicas moving rows over a few hot unique keys at once take
// River's unique-key locks in one order: no batch fails with a deadlock
// (40P01), or anything else, and every unique key ends as one job. One
// row in 100 is invalid, so about half the batches take the Go path
// (River's InsertManyTx) and the others the SQL move, side by side.
func TestReplicasOnHotUniqueKeysDoNotDeadlock(t *testing.T) {
	ctx := context.Background()
	pool := dbtest.NewPool(t)
	const rows, keys = 4000, 20
	// Keys in a shuffled order of ids, so every batch takes them in an
	// order of its own.
	if _, err := pool.Exec(ctx, `
INSERT INTO staged_jobs (job_name, job_args, unique_key, unique_states, priority)
SELECT 'k', jsonb_build_object('key', k), sha256(('key' || k)::bytea), $2::bit(8), CASE WHEN g % 100 = 0 THEN 9 END
FROM (SELECT g, (hashint4(g) & 2147483647) % $1::int AS k FROM generate_series(1, $3::int) g) s`,
		keys, fmt.Sprintf("%08b", riverdb.UniqueRequired), rows); err != nil {
		t.Fatal(err)
	}
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		errs []error
	)
	services := make([]*Service, 3)
	for i := range services {
		services[i] = newService(t, pool, func(st *Settings) { st.BatchSize = 50; st.Workers = 2 })
	}
	for _, s := range services {
		wg.Go(func() {
			// A failed batch is retried, as the loop would, a few times.
			for failed := 0; failed < 20; {
				res, err := s.RunOnce(ctx)
				if err != nil {
					failed++
					mu.Lock()
					errs = append(errs, err)
					mu.Unlock()
					continue
				}
				if res.taken() == 0 {
					return
				}
			}
		})
	}
	wg.Wait()
	for _, err := range errs {
		t.Errorf("a replica's batch failed: %v", err)
	}
	for i, s := range services {
		if v := testutil.ToFloat64(s.metrics.batchErrors); v != 0 {
			t.Errorf("replica %d: idemd_enqueuer_batch_errors_total = %v, want 0", i, v)
		}
	}
	if n := count(t, pool, `SELECT count(*) FROM staged_jobs`); n != 0 {
		t.Fatalf("%d rows still staged", n)
	}
	if n := count(t, pool, `SELECT count(*) FROM staged_jobs_dead`); n != rows/100 {
		t.Fatalf("%d rows dead-lettered, want the %d invalid ones", n, rows/100)
	}
	if n := count(t, pool, `SELECT count(DISTINCT unique_key) FROM river_job`); n != keys {
		t.Fatalf("%d unique keys in River, want %d", n, keys)
	}
	if n := count(t, pool, `SELECT count(*) FROM river_job`); n != keys {
		t.Fatalf("%d River jobs, want one per unique key (%d)", n, keys)
	}
}

// classifyRefusal tells a refusal no retry heals from a failure a retry
// may, and names the fix for each.
func TestClassifyRefusal(t *testing.T) {
	pg := func(code, msg string) error {
		return fmt.Errorf("enqueuer batch: move: %w", &pgconn.PgError{Code: code, Message: msg})
	}
	for _, tc := range []struct {
		err         error
		cause, want string // cause "": not a refusal
	}{
		{fmt.Errorf("x: %w", errJobsDropped), RefusalJobsDropped, "drop it"},
		{pg("P0001", "idemd move: 2 staged rows taken but 1 River jobs written or found"), RefusalJobsDropped, "drop it"},
		{pg("P0001", "raised by a trigger"), "", ""},
		{fmt.Errorf("x: %w", errTableRefused), RefusalTableRefused, "undo the change"},
		{pg("42501", "permission denied for table river_migration"), RefusalPermission, "river-grants.sql"},
		{pg("42501", "permission denied for sequence river_job_id_seq"), RefusalPermission, "river-grants.sql"},
		{pg("42501", "permission denied for table staged_jobs"), RefusalPermission, "as idemd_migrator"},
		{pg("42P01", `relation "river_job" does not exist`), RefusalRelationMissing, "idemctl migrate"},
		{pg("42883", "function river_job_state_in_bitmask does not exist"), RefusalRelationMissing, "idemctl migrate"},
		{pg("40P01", "deadlock detected"), "", ""},
		{pg("57014", "canceling statement due to statement timeout"), "", ""},
		{pg("23514", "check constraint"), "", ""},
		{context.DeadlineExceeded, "", ""},
		{errors.New("conn closed"), "", ""},
	} {
		r := classifyRefusal(tc.err)
		switch {
		case tc.cause == "" && r != nil:
			t.Errorf("%v: refusal %+v, want none", tc.err, r)
		case tc.cause != "" && (r == nil || r.cause != tc.cause || !strings.Contains(r.fix, tc.want)):
			t.Errorf("%v: refusal %+v, want cause %s with a fix naming %q", tc.err, r, tc.cause, tc.want)
		}
	}
}
