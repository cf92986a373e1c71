package migrate_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemd/idemd/internal/migrate"
	"github.com/idemd/idemd/internal/testing/dbtest"
	"github.com/idemd/idemd/migrations"
)

func TestMain(m *testing.M) { dbtest.Main(m) }

// emptyDatabase returns a pool on a brand-new, unmigrated database, as the
// migrator role.
func emptyDatabase(t *testing.T) *pgxpool.Pool {
	t.Helper()
	admin := dbtest.ServerURL(t)
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, admin)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	name := "idemd_mig_" + sanitize(t.Name())
	if _, err := conn.Exec(ctx, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)"); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		t.Fatal(err)
	}
	// The documented roles, and the pool as idemd_migrator: `idemctl
	// migrate` runs as that role in production (deploy/sql/roles.sql).
	if err := dbtest.ApplyRoles(ctx, dbtest.WithDatabase(admin, name)); err != nil {
		t.Fatal(err)
	}
	pool, err := pgxpool.New(ctx, dbtest.MigratorURL(dbtest.WithDatabase(admin, name)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		pool.Close()
		c, err := pgx.Connect(context.Background(), admin)
		if err == nil {
			c.Exec(context.Background(), "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)") //nolint:errcheck
			c.Close(context.Background())
		}
	})
	return pool
}

func sanitize(s string) string {
	out := make([]byte, 0, len(s))
	for _, c := range []byte(s) {
		if c >= 'A' && c <= 'Z' {
			c += 'a' - 'A'
		}
		if (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') {
			out = append(out, c)
		} else {
			out = append(out, '_')
		}
	}
	return string(out)
}

func TestUpTwiceAndConcurrently(t *testing.T) {
	pool := emptyDatabase(t)
	ctx := context.Background()

	var wg sync.WaitGroup
	results := make([]*migrate.Result, 4)
	errs := make([]error, 4)
	for i := range results {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i], errs[i] = migrate.Up(ctx, pool, migrate.Options{})
		}()
	}
	wg.Wait()
	appliedIdemd, appliedRiver := 0, 0
	for i, err := range errs {
		if err != nil {
			t.Fatalf("migrator %d: %v", i, err)
		}
		appliedIdemd += len(results[i].IdemdVersions)
		appliedRiver += len(results[i].RiverVersions)
	}
	// Exactly one migrator did the work; the others found nothing to do.
	var wantIdemd int64
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM idemd_schema_migrations WHERE version_id > 0").Scan(&wantIdemd); err != nil {
		t.Fatal(err)
	}
	if int64(appliedIdemd) != wantIdemd || wantIdemd < 4 {
		t.Fatalf("idemd migrations applied %d times across migrators, table records %d", appliedIdemd, wantIdemd)
	}
	if appliedRiver == 0 {
		t.Fatal("no River migration applied")
	}

	again, err := migrate.Up(ctx, pool, migrate.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if len(again.IdemdVersions)+len(again.RiverVersions) != 0 {
		t.Fatalf("second run applied %+v", again)
	}
	for _, table := range []string{"idempotency_keys", "staged_jobs", "staged_jobs_dead", "idempotency_key_reviews", "river_job"} {
		var ok bool
		if err := pool.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", table).Scan(&ok); err != nil || !ok {
			t.Fatalf("table %s missing (err %v)", table, err)
		}
	}
}

// An API already running on the article's schema keeps working: its rows
// survive, and its two-column INSERT into staged_jobs still succeeds. The
// article's tables are created by the migrator here: on an existing
// database they must be handed over to it (ALTER TABLE ... OWNER TO
// idemd_migrator, docs/operations.md), since adding columns and indexes
// takes the table's owner.
func TestAdditiveOnArticleSchema(t *testing.T) {
	pool := emptyDatabase(t)
	ctx := context.Background()
	article := migrations.ArticleSchema + `
CREATE TABLE staged_jobs (id BIGSERIAL PRIMARY KEY, job_name TEXT NOT NULL, job_args JSONB NOT NULL);
INSERT INTO users (email) VALUES ('a@example.com');
INSERT INTO idempotency_keys (idempotency_key, request_method, request_params, request_path, recovery_point, user_id, response_code, response_body)
VALUES ('k1', 'POST', '{}', '/rides', 'finished', 1, 201, '{"id": 1}');
INSERT INTO staged_jobs (job_name, job_args) VALUES ('send_ride_receipt', '{"ride_id": 1}');
`
	if _, err := pool.Exec(ctx, article); err != nil {
		t.Fatal(err)
	}
	if _, err := migrate.Up(ctx, pool, migrate.Options{}); err != nil {
		t.Fatal(err)
	}
	var keys, staged int
	if err := pool.QueryRow(ctx, "SELECT (SELECT count(*) FROM idempotency_keys WHERE response_body = '{\"id\": 1}'), (SELECT count(*) FROM staged_jobs WHERE created_at IS NOT NULL)").Scan(&keys, &staged); err != nil {
		t.Fatal(err)
	}
	if keys != 1 || staged != 1 {
		t.Fatalf("article rows lost: keys=%d staged=%d", keys, staged)
	}
	if _, err := pool.Exec(ctx, "INSERT INTO staged_jobs (job_name, job_args) VALUES ('send_ride_receipt', '{\"ride_id\": 2}')"); err != nil {
		t.Fatalf("article-style insert broke: %v", err)
	}
	var nIdx int
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM pg_indexes WHERE tablename = 'idempotency_keys' AND indexdef LIKE '%(user_id, idempotency_key)%'").Scan(&nIdx); err != nil {
		t.Fatal(err)
	}
	if nIdx != 1 {
		t.Fatalf("unique index duplicated or missing: %d", nIdx)
	}
}

// TestCheckNamesWhatIsMissing: an empty database lacks every migration and
// Check says which and what to run; after Up it is current.
func TestCheckNamesWhatIsMissing(t *testing.T) {
	pool := emptyDatabase(t)
	ctx := context.Background()
	err := migrate.Check(ctx, pool)
	var pending *migrate.PendingError
	if !errors.As(err, &pending) || len(pending.River) == 0 || len(pending.Idemd) == 0 {
		t.Fatalf("empty database: %v", err)
	}
	if !strings.Contains(err.Error(), "00011_idemd_leases.sql") || !strings.Contains(err.Error(), "idemctl migrate") {
		t.Fatalf("message does not name the migration and the fix: %v", err)
	}
	if _, err := migrate.Up(ctx, pool, migrate.Options{}); err != nil {
		t.Fatal(err)
	}
	if err := migrate.Check(ctx, pool); err != nil {
		t.Fatalf("after Up: %v", err)
	}
	// Undo the newest idemd migration's record: Check notices.
	if _, err := pool.Exec(ctx, "DELETE FROM idemd_schema_migrations WHERE version_id = (SELECT max(version_id) FROM idemd_schema_migrations)"); err != nil {
		t.Fatal(err)
	}
	if err := migrate.Check(ctx, pool); !errors.As(err, &pending) || len(pending.Idemd) != 1 || len(pending.River) != 0 {
		t.Fatalf("one idemd migration unrecorded: %v", err)
	}
}

// River's GIN indexes on river_job keep no pending list after migrate
// (00020): the enqueuer, the one process inserting River jobs, never
// meets a merge of the list on its move path.
func TestRiverGINIndexesHaveNoPendingList(t *testing.T) {
	pool := emptyDatabase(t)
	ctx := context.Background()
	if _, err := migrate.Up(ctx, pool, migrate.Options{}); err != nil {
		t.Fatal(err)
	}
	rows, err := pool.Query(ctx, `
SELECT c.relname, coalesce(array_to_string(c.reloptions, ','), '')
FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid JOIN pg_am a ON a.oid = c.relam
WHERE i.indrelid = 'river_job'::regclass AND a.amname = 'gin'`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	n := 0
	for rows.Next() {
		var name, opts string
		if err := rows.Scan(&name, &opts); err != nil {
			t.Fatal(err)
		}
		n++
		if !strings.Contains(opts, "fastupdate=off") {
			t.Errorf("GIN index %s on river_job has options %q, want fastupdate=off", name, opts)
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if n < 2 {
		t.Fatalf("%d GIN indexes on river_job, want River's args and metadata indexes", n)
	}
}

// A GIN index whose pending list came back (a River migration that
// rebuilt it) loses it again at the next migrate.
func TestMigrateKeepsRiverGINWithoutPendingList(t *testing.T) {
	pool := emptyDatabase(t)
	ctx := context.Background()
	if _, err := migrate.Up(ctx, pool, migrate.Options{}); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `ALTER INDEX river_job_args_index RESET (fastupdate)`); err != nil {
		t.Fatal(err)
	}
	if _, err := migrate.Up(ctx, pool, migrate.Options{}); err != nil {
		t.Fatal(err)
	}
	var opts string
	if err := pool.QueryRow(ctx, `SELECT coalesce(array_to_string(reloptions, ','), '') FROM pg_class WHERE oid = 'river_job_args_index'::regclass`).Scan(&opts); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(opts, "fastupdate=off") {
		t.Fatalf("river_job_args_index after the second migrate: options %q, want fastupdate=off", opts)
	}
}
