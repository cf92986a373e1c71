package migrate_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"

	rolesql "github.com/idemd/idemd/deploy/sql"
	"github.com/idemd/idemd/internal/enqueuer"
	"github.com/idemd/idemd/internal/migrate"
	"github.com/idemd/idemd/internal/testing/dbtest"
	"github.com/idemd/idemd/internal/testing/scratchdb"
)

// riverFirst is a database where an API's own role installed River with
// River's rivermigrate before idemd came: River's tables are that role's.
type riverFirst struct {
	admin, owner string // URLs: the server's admin, River's owner (the API's role)
	ownerRole    string
	dbURL        string // the database, as the admin
}

func newRiverFirst(t *testing.T, riverSchema string) *riverFirst {
	t.Helper()
	ctx := context.Background()
	server := dbtest.ServerURL(t)
	dbURL, drop, err := scratchdb.Create(ctx, server, "idemd_riverfirst")
	if err != nil {
		t.Fatal(err)
	}
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	role, password := "idemd_test_api_"+hex.EncodeToString(b), hex.EncodeToString(b)+"pw"
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := drop(ctx); err != nil {
			t.Logf("drop database: %v", err)
		}
		if conn, err := pgx.Connect(ctx, server); err == nil {
			_, _ = conn.Exec(ctx, "DROP ROLE IF EXISTS "+pgx.Identifier{role}.Sanitize())
			conn.Close(ctx)
		}
	})
	adminExec(t, dbURL, "CREATE ROLE "+pgx.Identifier{role}.Sanitize()+" LOGIN PASSWORD '"+password+"'",
		"GRANT CREATE ON SCHEMA public TO "+pgx.Identifier{role}.Sanitize())
	u, err := url.Parse(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.UserPassword(role, password)
	r := &riverFirst{admin: dbURL, owner: u.String(), ownerRole: role, dbURL: dbURL}
	if riverSchema != "" {
		adminExec(t, dbURL, "CREATE SCHEMA "+riverSchema+" AUTHORIZATION "+pgx.Identifier{role}.Sanitize())
	}
	// As River's docs have it: the API's role runs River's migrations.
	owner := pool(t, r.owner)
	m, err := rivermigrate.New(riverpgxv5.New(owner), &rivermigrate.Config{Schema: riverSchema})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.Migrate(ctx, rivermigrate.DirectionUp, nil); err != nil {
		t.Fatal(err)
	}
	// Then idemd's documented path: roles.sql as the admin, the API's role
	// in the API group.
	if err := dbtest.ApplyRoles(ctx, dbURL); err != nil {
		t.Fatal(err)
	}
	adminExec(t, dbURL, "GRANT idemd_api TO "+pgx.Identifier{role}.Sanitize())
	return r
}

func adminExec(t *testing.T, dbURL string, sqls ...string) {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	for _, s := range sqls {
		if _, err := conn.Exec(ctx, s); err != nil {
			t.Fatalf("%s: %v", s, err)
		}
	}
}

func pool(t *testing.T, u string) *pgxpool.Pool {
	t.Helper()
	p, err := pgxpool.New(context.Background(), u)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

// stageAndMove stages a job as the API's role and moves it as idemd's
// runtime role, which also reads what `idemctl status` reads.
func (r *riverFirst) stageAndMove(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	if _, err := pool(t, r.owner).Exec(ctx, `INSERT INTO staged_jobs (job_name, job_args) VALUES ('send_receipt', '{"ride_id": 1}')`); err != nil {
		t.Fatalf("the API stages a job: %v", err)
	}
	runtime := pool(t, dbtest.RuntimeURL(r.dbURL))
	s, err := enqueuer.New(enqueuer.Config{Settings: enqueuer.DefaultSettings(), Pool: runtime})
	if err != nil {
		t.Fatal(err)
	}
	res, err := s.RunOnce(ctx)
	if err != nil || res.Moved != 1 {
		t.Fatalf("the enqueuer as idemd_runtime: %+v, %v", res, err)
	}
	var jobs, versions int
	if err := runtime.QueryRow(ctx, `SELECT (SELECT count(*) FROM river_job WHERE kind = 'send_receipt'),
    (SELECT count(*) FROM idemd_schema_migrations)`).Scan(&jobs, &versions); err != nil || jobs != 1 || versions == 0 {
		t.Fatalf("idemd_runtime reads %d River jobs and %d idemd versions: %v", jobs, versions, err)
	}
}

func riverOwner(t *testing.T, dbURL string) string {
	t.Helper()
	var owner string
	if err := pool(t, dbURL).QueryRow(context.Background(),
		`SELECT relowner::regrole::text FROM pg_class WHERE oid = 'river_job'::regclass`).Scan(&owner); err != nil {
		t.Fatal(err)
	}
	return owner
}

// River installed first by the API's role: `idemctl migrate` as
// idemd_migrator leaves River's tables to their owner, applies idemd's,
// and once River's owner ran deploy/sql/river-grants.sql the enqueuer, as
// idemd_runtime, moves the API's staged jobs into that River.
func TestMigrateBesideRiverOwnedByTheAPI(t *testing.T) {
	ctx := context.Background()
	r := newRiverFirst(t, "")
	if _, err := pool(t, r.owner).Exec(ctx, rolesql.RiverGrants); err != nil {
		t.Fatalf("deploy/sql/river-grants.sql as River's owner: %v", err)
	}
	res, err := migrate.Up(ctx, pool(t, dbtest.MigratorURL(r.dbURL)), migrate.Options{})
	if err != nil {
		t.Fatalf("idemctl migrate as idemd_migrator beside the API's River: %v", err)
	}
	if res.RiverOwner != r.ownerRole || len(res.RiverVersions) != 0 || len(res.IdemdVersions) == 0 {
		t.Fatalf("migrate: %+v, want River left to %s and idemd's migrations applied", res, r.ownerRole)
	}
	if owner := riverOwner(t, r.admin); owner != r.ownerRole {
		t.Fatalf("river_job belongs to %s after migrate, want still %s", owner, r.ownerRole)
	}
	// Run again: nothing to do, still River's owner's.
	if res, err := migrate.Up(ctx, pool(t, dbtest.MigratorURL(r.dbURL)), migrate.Options{}); err != nil || len(res.IdemdVersions) != 0 {
		t.Fatalf("second migrate: %+v, %v", res, err)
	}
	r.stageAndMove(t)
}

// Run as River's owner instead (the API's role runs `idemctl migrate`):
// River stays that role's, idemd's tables are created by it, and the
// grants migrate applies still give idemd_runtime idemd's tables, so the
// daemons and status work.
func TestMigrateAsRiversOwner(t *testing.T) {
	ctx := context.Background()
	r := newRiverFirst(t, "")
	res, err := migrate.Up(ctx, pool(t, r.owner), migrate.Options{})
	if err != nil {
		t.Fatalf("idemctl migrate as River's owner: %v", err)
	}
	if res.RiverOwner != "" || len(res.IdemdVersions) == 0 {
		t.Fatalf("migrate: %+v, want River's migrations run by their owner and idemd's applied", res)
	}
	r.stageAndMove(t)
}

// River installed in a schema of its own (River's Schema option), not on
// the search path: migrate refuses, naming the fix, instead of creating a
// second River in public; the enqueuer's gate says the same.
func TestRiverInAnotherSchemaIsRefused(t *testing.T) {
	ctx := context.Background()
	r := newRiverFirst(t, "jobs")
	_, err := migrate.Up(ctx, pool(t, dbtest.MigratorURL(r.dbURL)), migrate.Options{})
	if err == nil || !strings.Contains(err.Error(), "schema jobs") || !strings.Contains(err.Error(), "search_path = jobs, public") {
		t.Fatalf("migrate beside River in schema jobs: %v, want a refusal naming the search path", err)
	}
	var publicRiver bool
	if err := pool(t, r.admin).QueryRow(ctx, `SELECT to_regclass('public.river_job') IS NOT NULL`).Scan(&publicRiver); err != nil || publicRiver {
		t.Fatalf("a second River in public: %v, %v", publicRiver, err)
	}
}

// Every daemon's /readyz (Inspect) needs River at the oldest schema the
// enqueuer writes, not River's newest: an API may run River one schema
// behind. Below it, the daemons are not ready and name the migration.
// Where the runtime role may not read River's version at all (River the
// API's, river-grants.sql not run yet), the completer and reaper stay
// ready: only the enqueuer touches River, and its gate reports it.
func TestInspectNeedsRiversOldestKnownSchema(t *testing.T) {
	ctx := context.Background()
	runtime := dbtest.NewPool(t)
	rm, err := rivermigrate.New(riverpgxv5.New(dbtest.MigratorPool(t, runtime)), nil)
	if err != nil {
		t.Fatal(err)
	}
	oldest := migrate.RiverSchemaVersions[0]
	if _, err := rm.Migrate(ctx, rivermigrate.DirectionDown, &rivermigrate.MigrateOpts{TargetVersion: oldest}); err != nil {
		t.Fatal(err)
	}
	s, err := migrate.Inspect(ctx, runtime, migrate.Newest())
	if err != nil || s.Err() != nil {
		t.Fatalf("River at schema %d: %v, %v; want ready", oldest, err, s.Err())
	}
	if _, err := rm.Migrate(ctx, rivermigrate.DirectionDown, &rivermigrate.MigrateOpts{TargetVersion: oldest - 1}); err != nil {
		t.Fatal(err)
	}
	s, err = migrate.Inspect(ctx, runtime, migrate.Newest())
	if err != nil || s.Err() == nil || !strings.Contains(s.Err().Error(), fmt.Sprintf("River migration %d", oldest)) {
		t.Fatalf("River at schema %d: %v, %v; want not ready naming River migration %d", oldest-1, err, s.Err(), oldest)
	}

	r := newRiverFirst(t, "")
	if _, err := migrate.Up(ctx, pool(t, dbtest.MigratorURL(r.dbURL)), migrate.Options{}); err != nil {
		t.Fatal(err)
	}
	s, err = migrate.Inspect(ctx, pool(t, dbtest.RuntimeURL(r.dbURL)), migrate.Newest())
	if err != nil || s.Err() != nil {
		t.Fatalf("River the API's, river_migration not readable by idemd_runtime: %v, %v; want ready", err, s.Err())
	}
}
