package migrate_test

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"

	"github.com/idemd/idemd/internal/migrate"
	"github.com/idemd/idemd/internal/testing/dbtest"
)

// wantPrivileges are the grants on idemd's tables that exist only after a
// migration, as docs/operations.md ("Database roles") lists them: true
// must be held, false must not.
var wantPrivileges = []struct {
	role, table, privilege string
	held                   bool
}{
	{dbtest.APIRole, "idempotency_keys", "INSERT", true},
	{dbtest.APIRole, "idempotency_keys", "UPDATE", true},
	{dbtest.APIRole, "idempotency_keys", "DELETE", false},
	{dbtest.APIRole, "staged_jobs", "INSERT", true},
	{dbtest.APIRole, "staged_jobs", "DELETE", false},
	{dbtest.APIRole, "idemd_replay_nonces", "INSERT", true},
	{dbtest.APIRole, "idemd_replay_nonces", "DELETE", true},
	{dbtest.APIRole, "idemd_operator_actions", "SELECT", false},
	{dbtest.RuntimeRole, "idemd_operator_actions", "INSERT", true},
	{dbtest.RuntimeRole, "idemd_operator_actions", "UPDATE", false},
	{dbtest.RuntimeRole, "idemd_operator_actions", "DELETE", false},
	{dbtest.RuntimeRole, "idemd_replay_nonces", "DELETE", true},
	{dbtest.RuntimeRole, "staged_jobs", "DELETE", true},
}

// checkGrants asks the catalogue (has_table_privilege) for each privilege,
// then has the API group really stage a job and record a nonce, and the
// runtime really fail to rewrite the audit trail, as the admin acting as
// each role.
func checkGrants(t *testing.T, admin *pgxpool.Pool) {
	t.Helper()
	ctx := context.Background()
	for _, w := range wantPrivileges {
		var held bool
		if err := admin.QueryRow(ctx, `SELECT has_table_privilege($1, $2, $3)`, w.role, "public."+w.table, w.privilege).Scan(&held); err != nil {
			t.Fatal(err)
		}
		if held != w.held {
			t.Errorf("%s %s on %s: held %v, want %v", w.role, w.privilege, w.table, held, w.held)
		}
	}
	asRole := func(role, sql string) error {
		return pgx.BeginFunc(ctx, admin, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, "SET LOCAL ROLE "+pgx.Identifier{role}.Sanitize()); err != nil {
				t.Fatal(err)
			}
			_, err := tx.Exec(ctx, sql)
			if err == nil {
				err = errRollback
			}
			return err
		})
	}
	for _, sql := range []string{
		`INSERT INTO staged_jobs (job_name, job_args) VALUES ('send_receipt', '{}')`,
		`INSERT INTO idemd_replay_nonces (nonce, expires_at) VALUES ('n1', now()) ON CONFLICT (nonce) DO NOTHING`,
	} {
		if err := asRole(dbtest.APIRole, sql); !errors.Is(err, errRollback) {
			t.Errorf("as %s: %s: %v", dbtest.APIRole, sql, err)
		}
	}
	var pgErr *pgconn.PgError
	if err := asRole(dbtest.RuntimeRole, `UPDATE idemd_operator_actions SET note = note`); !errors.As(err, &pgErr) || pgErr.Code != "42501" {
		t.Errorf("as %s: UPDATE idemd_operator_actions: %v, want 42501", dbtest.RuntimeRole, err)
	}
}

var errRollback = errors.New("rolled back on purpose")

func adminPool(t *testing.T, pool *pgxpool.Pool) *pgxpool.Pool {
	t.Helper()
	admin, err := pgxpool.New(context.Background(), dbtest.WithDatabase(dbtest.ServerURL(t), pool.Config().ConnConfig.Database))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(admin.Close)
	return admin
}

// TestFirstInstallGrants: roles.sql once, then `idemctl migrate` (migrate.Up
// as idemd_migrator) and nothing else: the API group can use idemd's
// tables and the audit table is append-only for the runtime.
func TestFirstInstallGrants(t *testing.T) {
	pool := emptyDatabase(t)
	if _, err := migrate.Up(context.Background(), pool, migrate.Options{}); err != nil {
		t.Fatal(err)
	}
	checkGrants(t, adminPool(t, pool))
}

// TestUpgradeGrants: a database an earlier release migrated up to 00013,
// with the API group holding nothing at all (the worst case an upgrade can
// meet), is upgraded by `idemctl migrate` alone: the tables the upgrade
// creates (idemd_replay_nonces, idemd_operator_actions) and the old ones
// get their grants, and the new audit table loses the UPDATE and DELETE
// the default privileges gave the runtime.
func TestUpgradeGrants(t *testing.T) {
	pool := emptyDatabase(t)
	ctx := context.Background()
	rm, err := rivermigrate.New(riverpgxv5.New(pool), nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := rm.Migrate(ctx, rivermigrate.DirectionUp, nil); err != nil {
		t.Fatal(err)
	}
	migrateUpTo(t, pool, 13)
	admin := adminPool(t, pool)
	var nonces *string
	if err := admin.QueryRow(ctx, `SELECT to_regclass('public.idemd_replay_nonces')::text`).Scan(&nonces); err != nil || nonces != nil {
		t.Fatalf("setup: idemd_replay_nonces exists before the upgrade (%v, %v)", nonces, err)
	}
	if _, err := admin.Exec(ctx, `REVOKE ALL ON ALL TABLES IN SCHEMA public FROM `+dbtest.APIRole); err != nil {
		t.Fatal(err)
	}

	res, err := migrate.Up(ctx, pool, migrate.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.IdemdVersions) == 0 {
		t.Fatal("the upgrade applied no idemd migration")
	}
	checkGrants(t, admin)
}

// TestGrantsRerun: migrate applies the grants on every run, also one that
// applies no migration, and a rerun keeps them as they are.
func TestGrantsRerun(t *testing.T) {
	ctx := context.Background()
	pool := emptyDatabase(t)
	if _, err := migrate.Up(ctx, pool, migrate.Options{}); err != nil {
		t.Fatal(err)
	}
	admin := adminPool(t, pool)
	// Someone took the API group's grants away by hand; the next migrate,
	// with nothing to migrate, puts them back.
	if _, err := admin.Exec(ctx, `REVOKE ALL ON ALL TABLES IN SCHEMA public FROM `+dbtest.APIRole); err != nil {
		t.Fatal(err)
	}
	res, err := migrate.Up(ctx, pool, migrate.Options{})
	if err != nil {
		t.Fatalf("second migrate: %v", err)
	}
	if len(res.IdemdVersions)+len(res.RiverVersions) != 0 {
		t.Fatalf("second migrate applied %v %v", res.RiverVersions, res.IdemdVersions)
	}
	checkGrants(t, admin)
}
