package dbtest_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	rolesql "github.com/idemd/idemd/deploy/sql"
	"github.com/idemd/idemd/idem"
	"github.com/idemd/idemd/internal/testing/dbtest"
	"github.com/idemd/idemd/internal/testing/testwait"
)

func TestMain(m *testing.M) { dbtest.Main(m) }

// The role the tests (and the daemons) run as really is least-privilege:
// not a superuser, no CREATE on the database or its schema, owner of
// nothing, and a CREATE TABLE is refused; every idemd and River table is
// the migrator's and the runtime may read and write it.
func TestRuntimeRoleIsLeastPrivilege(t *testing.T) {
	ctx := context.Background()
	dbURL := dbtest.NewDatabase(t)
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)

	var user string
	var super, createDB, createSchema, createTemp bool
	var owned int
	if err := conn.QueryRow(ctx, `
SELECT current_user, r.rolsuper,
       has_database_privilege(current_database(), 'CREATE'),
       has_schema_privilege('public', 'CREATE'),
       has_database_privilege(current_database(), 'TEMPORARY'),
       (SELECT count(*) FROM pg_class WHERE relowner = r.oid)
  FROM pg_roles r WHERE r.rolname = current_user`).Scan(&user, &super, &createDB, &createSchema, &createTemp, &owned); err != nil {
		t.Fatal(err)
	}
	if user != dbtest.RuntimeRole || super || createDB || createSchema || owned != 0 {
		t.Fatalf("connected as %s: superuser %v, CREATE on database %v, CREATE on schema public %v, owns %d relations; want %s, none of them",
			user, super, createDB, createSchema, owned, dbtest.RuntimeRole)
	}
	// TEMPORARY is PUBLIC's by PostgreSQL's default and no component needs
	// it; logged rather than asserted, since roles.sql does not revoke a
	// default other applications on the database may rely on.
	t.Logf("TEMPORARY on the database (PUBLIC's default): %v", createTemp)

	_, err = conn.Exec(ctx, `CREATE TABLE runtime_must_not_create (id int)`)
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "42501" {
		t.Fatalf("CREATE TABLE as %s: %v, want insufficient_privilege (42501)", dbtest.RuntimeRole, err)
	}

	rows, err := conn.Query(ctx, `
SELECT c.relname, pg_get_userbyid(c.relowner),
       has_table_privilege(c.oid, 'SELECT') AND has_table_privilege(c.oid, 'INSERT') AND
       has_table_privilege(c.oid, 'UPDATE') AND has_table_privilege(c.oid, 'DELETE'),
       has_table_privilege(c.oid, 'TRUNCATE')
  FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
 WHERE n.nspname = 'public' AND c.relkind IN ('r', 'p')`)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for rows.Next() {
		var name, owner string
		var dml, truncate bool
		if err := rows.Scan(&name, &owner, &dml, &truncate); err != nil {
			t.Fatal(err)
		}
		seen[name] = true
		if name == "idemd_operator_actions" {
			continue // append-only: TestOperatorActionsAreAppendOnly
		}
		if owner != dbtest.MigratorRole || !dml || truncate {
			t.Errorf("table %s: owner %s, runtime DML %v, TRUNCATE %v; want owner %s, DML, no TRUNCATE", name, owner, dml, truncate, dbtest.MigratorRole)
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	// The one predefined role it is given: pg_read_all_stats, so the
	// reaper's throttle sees its replicas in pg_stat_replication. Not
	// pg_monitor, which also reads every setting.
	var stats, monitor bool
	if err := conn.QueryRow(ctx, `SELECT pg_has_role(current_user, 'pg_read_all_stats', 'USAGE'), pg_has_role(current_user, 'pg_monitor', 'USAGE')`).Scan(&stats, &monitor); err != nil {
		t.Fatal(err)
	}
	if !stats || monitor {
		t.Errorf("%s: pg_read_all_stats %v, pg_monitor %v; want only pg_read_all_stats", dbtest.RuntimeRole, stats, monitor)
	}
	for _, want := range []string{"idempotency_keys", "staged_jobs", "staged_jobs_dead", "idempotency_key_reviews", "idemd_leases", "idemd_replay_nonces", "idemd_reaper_runs", "idemd_reaper_pause", "idemd_operator_actions", "river_job"} {
		if !seen[want] {
			t.Errorf("table %s missing from the migrated database", want)
		}
	}
}

// The operators' audit table is append-only for the runtime role (what
// idemctl and the console run as): it may INSERT a record and SELECT them,
// never UPDATE, DELETE or TRUNCATE one; the API group has nothing on it. A
// database where the runtime got full DML on it (the default privileges
// give every new table that) is append-only again after the next
// `idemctl migrate`, whose grants step (grants.sql) takes it back.
func TestOperatorActionsAreAppendOnly(t *testing.T) {
	ctx := context.Background()
	dbURL := dbtest.NewDatabase(t)
	rt, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Close(ctx)
	admin, err := pgx.Connect(ctx, dbtest.AdminURL(t, dbURL))
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)

	check := func(when string) {
		t.Helper()
		var id int64
		if err := rt.QueryRow(ctx, `INSERT INTO idemd_operator_actions (actor, action, via, key_id, note)
VALUES ('alice', 'key_retry', 'idemctl', 1, 'API bug fixed') RETURNING id`).Scan(&id); err != nil {
			t.Fatalf("%s: INSERT as %s: %v", when, dbtest.RuntimeRole, err)
		}
		var actor string
		if err := rt.QueryRow(ctx, `SELECT actor FROM idemd_operator_actions WHERE id = $1`, id).Scan(&actor); err != nil || actor != "alice" {
			t.Fatalf("%s: SELECT as %s: %q, %v", when, dbtest.RuntimeRole, actor, err)
		}
		for _, q := range []string{
			`UPDATE idemd_operator_actions SET actor = 'mallory'`,
			`DELETE FROM idemd_operator_actions`,
			`TRUNCATE idemd_operator_actions`,
		} {
			_, err := rt.Exec(ctx, q)
			var pgErr *pgconn.PgError
			if !errors.As(err, &pgErr) || pgErr.Code != "42501" {
				t.Errorf("%s: %s as %s: %v, want insufficient_privilege (42501)", when, q, dbtest.RuntimeRole, err)
			}
		}
		var n int
		if err := rt.QueryRow(ctx, `SELECT count(*) FROM idemd_operator_actions WHERE actor = 'alice'`).Scan(&n); err != nil || n == 0 {
			t.Fatalf("%s: records after the refused statements: %d, %v", when, n, err)
		}
		var apiAny bool
		if err := admin.QueryRow(ctx, `SELECT has_table_privilege($1, 'idemd_operator_actions', 'SELECT, INSERT, UPDATE, DELETE, TRUNCATE')`,
			dbtest.APIRole).Scan(&apiAny); err != nil || apiAny {
			t.Errorf("%s: %s has privileges on idemd_operator_actions: %v, %v", when, dbtest.APIRole, apiAny, err)
		}
	}
	check("fresh install (roles.sql, then migrate)")

	// As the default privileges leave a new table before the grants step:
	// every DML privilege for the runtime.
	mig, err := pgx.Connect(ctx, dbtest.MigratorURL(dbURL))
	if err != nil {
		t.Fatal(err)
	}
	defer mig.Close(ctx)
	if _, err := mig.Exec(ctx, `GRANT SELECT, INSERT, UPDATE, DELETE ON idemd_operator_actions TO `+dbtest.RuntimeRole); err != nil {
		t.Fatal(err)
	}
	if _, err := rt.Exec(ctx, `UPDATE idemd_operator_actions SET note = note`); err != nil {
		t.Fatalf("setup: the runtime's UPDATE after the grant: %v", err)
	}
	// The grants step of the next migrate, as the migrator.
	if _, err := mig.Exec(ctx, rolesql.Grants); err != nil {
		t.Fatalf("deploy/sql/grants.sql as %s: %v", dbtest.MigratorRole, err)
	}
	check("after the next migrate's grants")
}

// A table a later migration adds (created by the migrator, as `idemctl
// migrate` would) is the runtime's to use at once, through roles.sql's
// default privileges, with no grant run by hand.
func TestLaterMigrationIsGrantedToRuntime(t *testing.T) {
	ctx := context.Background()
	dbURL := dbtest.NewDatabase(t)
	mig, err := pgx.Connect(ctx, dbtest.MigratorURL(dbURL))
	if err != nil {
		t.Fatal(err)
	}
	defer mig.Close(ctx)
	if _, err := mig.Exec(ctx, `CREATE TABLE later_migration (id BIGSERIAL PRIMARY KEY, v text)`); err != nil {
		t.Fatalf("CREATE TABLE as %s: %v", dbtest.MigratorRole, err)
	}

	rt, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Close(ctx)
	for _, q := range []string{
		`INSERT INTO later_migration (v) VALUES ('a')`, // the sequence too
		`UPDATE later_migration SET v = 'b'`,
		`SELECT v FROM later_migration`,
		`DELETE FROM later_migration`,
	} {
		if _, err := rt.Exec(ctx, q); err != nil {
			t.Errorf("%s as %s: %v", q, dbtest.RuntimeRole, err)
		}
	}
}

// The API group of roles.sql is enough for what package idem does (lock,
// create and update keys, stage jobs, reference keys from the API's own
// table, record and clean replay nonces) and no more: it may not delete
// keys (the reaper does), touch River, or extend a nonce's expiry. A login role of the test's own stands for the operator's API role.
func TestAPIGroupIsEnoughForTheAPI(t *testing.T) {
	ctx := context.Background()
	dbURL := dbtest.NewDatabase(t)
	admin, err := pgx.Connect(ctx, dbtest.AdminURL(t, dbURL))
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
	// Roles belong to the server; the database's name is unique to this
	// test, so a role named after it is too.
	var role string
	if err := admin.QueryRow(ctx, "SELECT current_database() || '_api'").Scan(&role); err != nil {
		t.Fatal(err)
	}
	r := pgx.Identifier{role}.Sanitize()
	// CREATE on public: the API's own tables are the operator's business,
	// granted to the API's role, not by roles.sql.
	for _, q := range []string{
		"CREATE ROLE " + r + " LOGIN IN ROLE " + dbtest.APIRole,
		"GRANT CREATE ON SCHEMA public TO " + r,
	} {
		if _, err := admin.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	t.Cleanup(func() {
		// Before the database is dropped (cleanups run last first), on a
		// connection of its own: the test's is closed by then. A role
		// owning objects or holding privileges cannot be dropped: drop
		// those first.
		ctx := context.Background()
		conn, err := pgx.Connect(ctx, dbtest.AdminURL(t, dbURL))
		if err != nil {
			t.Errorf("drop role %s: %v", role, err)
			return
		}
		defer conn.Close(ctx)
		for _, q := range []string{"DROP OWNED BY " + r, "DROP ROLE " + r} {
			if _, err := conn.Exec(ctx, q); err != nil {
				t.Errorf("%s: %v", q, err)
			}
		}
	})

	api, err := pgx.Connect(ctx, dbtest.AsRole(dbURL, role))
	if err != nil {
		t.Fatal(err)
	}
	defer api.Close(ctx)
	tx, err := api.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var keyID, jobID int64
	steps := []struct {
		sql  string
		scan []any
	}{
		{`INSERT INTO idempotency_keys (idempotency_key, user_id, request_method, request_params, request_path, recovery_point, upstream_idempotency_key)
		  VALUES ('k1', 1, 'POST', '{}', '/rides', 'started', gen_random_uuid()) RETURNING id`, []any{&keyID}},
		{`SELECT id FROM idempotency_keys WHERE user_id = 1 AND idempotency_key = 'k1' FOR UPDATE`, []any{&keyID}},
		{`UPDATE idempotency_keys SET recovery_point = 'finished', locked_at = NULL, response_code = 201, response_body = '{}' WHERE id = ` + "$1 RETURNING id", []any{&keyID}},
		{`INSERT INTO staged_jobs (job_name, job_args) VALUES ('send_receipt', '{}') RETURNING id`, []any{&jobID}},
		{`CREATE TABLE api_rides (id BIGSERIAL PRIMARY KEY, idempotency_key_id BIGINT REFERENCES idempotency_keys ON DELETE SET NULL) `, nil},
	}
	for _, s := range steps {
		var err error
		if s.scan == nil {
			_, err = tx.Exec(ctx, s.sql)
		} else if strings.Contains(s.sql, "$1") {
			err = tx.QueryRow(ctx, s.sql, keyID).Scan(s.scan...)
		} else {
			err = tx.QueryRow(ctx, s.sql).Scan(s.scan...)
		}
		if err != nil {
			t.Fatalf("as a member of %s: %s: %v", dbtest.APIRole, s.sql, err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}

	// Replay nonces (idem.ReplayNonces, which ReplayAuth uses): record,
	// refuse a replay, delete expired rows.
	apiPool, err := pgxpool.New(ctx, dbtest.AsRole(dbURL, role))
	if err != nil {
		t.Fatal(err)
	}
	defer apiPool.Close()
	nonces := idem.NewReplayNonces(apiPool, idem.ReplayNoncesOptions{})
	for _, u := range []struct {
		nonce   string
		expires time.Time
		fresh   bool
	}{
		{"expired", time.Now().Add(-time.Hour), true},
		{"n1", time.Now().Add(5 * time.Minute), true},
		{"n1", time.Now().Add(5 * time.Minute), false},
	} {
		fresh, err := nonces.Use(ctx, u.nonce, u.expires)
		if err != nil || fresh != u.fresh {
			t.Fatalf("as a member of %s: record replay nonce %s: fresh %v, err %v; want fresh %v", dbtest.APIRole, u.nonce, fresh, err, u.fresh)
		}
	}
	if st := nonces.Stats(); st.Deleted != 1 || st.CleanupErrors != 0 {
		t.Fatalf("as a member of %s: cleanup of the expired nonce: %+v, want 1 deleted", dbtest.APIRole, st)
	}

	for _, q := range []string{
		`DELETE FROM idempotency_keys`,
		`SELECT count(*) FROM river_job`,
		`DELETE FROM staged_jobs`,
		`UPDATE idemd_replay_nonces SET expires_at = now() + interval '1 day'`,
	} {
		_, err := api.Exec(ctx, q)
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != "42501" {
			t.Errorf("as a member of %s: %s: %v, want insufficient_privilege (42501)", dbtest.APIRole, q, err)
		}
	}
}

// ApplyRoles waits while another process applies the roles on the same
// server: the test holds the cross-process lock on a session of its own,
// as another package's test binary would, sees ApplyRoles queue for it
// (pg_locks), and sees it finish once the lock is released. Without the
// lock, concurrent GRANTs on the same roles fail with "tuple concurrently
// updated".
func TestApplyRolesWaitsForAnotherProcess(t *testing.T) {
	ctx := context.Background()
	admin := dbtest.AdminURL(t, dbtest.NewDatabase(t))
	other, err := pgx.Connect(ctx, dbtest.WithDatabase(admin, "postgres"))
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close(ctx)
	if _, err := other.Exec(ctx, "SELECT pg_advisory_lock($1)", dbtest.RolesLockKey); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- dbtest.ApplyRoles(ctx, admin) }()
	// An advisory lock's 64-bit key is split into classid (high half) and
	// objid (low half) in pg_locks.
	testwait.Until(t, 30*time.Second, "ApplyRoles queues for the roles' lock", func() bool {
		select {
		case err := <-done:
			t.Fatalf("ApplyRoles returned (%v) while another process held the roles' lock", err)
		default:
		}
		var waiting bool
		if err := other.QueryRow(ctx, `
SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND NOT granted
  AND classid::int8 = ($1::int8 >> 32) AND objid::int8 = ($1::int8 & x'ffffffff'::int8))`, dbtest.RolesLockKey).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		return waiting
	})
	if _, err := other.Exec(ctx, "SELECT pg_advisory_unlock($1)", dbtest.RolesLockKey); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(time.Minute):
		t.Fatal("ApplyRoles did not finish after the lock was released")
	}
}
