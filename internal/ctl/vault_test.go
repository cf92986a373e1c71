package ctl_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemd/idemd/internal/daemon"
	"github.com/idemd/idemd/internal/migrate"
	"github.com/idemd/idemd/internal/testing/dbtest"
	"github.com/idemd/idemd/internal/testing/testwait"
)

// olderRelease is the idemd migration a release behind stops at in
// TestVaultMigratorLeases: the versions after it (the reaper's throttle,
// its runs' retention, the dead key) are the newer release's.
const olderRelease = 21

// ownedSQL counts the objects a role owns in the database, by catalog:
// relations (tables, indexes, sequences), schemas, functions and types.
const ownedSQL = `
SELECT (SELECT count(*) FROM pg_catalog.pg_class WHERE relowner = to_regrole($1))
     + (SELECT count(*) FROM pg_catalog.pg_namespace WHERE nspowner = to_regrole($1))
     + (SELECT count(*) FROM pg_catalog.pg_proc WHERE proowner = to_regrole($1))
     + (SELECT count(*) FROM pg_catalog.pg_type WHERE typowner = to_regrole($1))`

// TestVaultMigratorLeases is `idemctl migrate` run by Vault's database
// secrets engine's dynamic users: three leases in a row, each a login
// role created IN ROLE idemd_migrator with a password (docs/operations.md's
// creation statement), on a server that asks for passwords. The first
// migrates to the schema of a release behind, the second and third to
// this one's; each is dropped once its migration ends, as Vault's
// revocation does. The oracle is the catalog's: none of them owns an
// object (pg_class, pg_namespace, pg_proc, pg_type), each DROP ROLE
// succeeds, and every idemd object belongs to idemd_migrator. A fourth
// lease goes through a transaction-mode pooler, refused until its default
// role is idemd_migrator. The runtime's credentials given to the migration
// are refused, exit 2.
func TestVaultMigratorLeases(t *testing.T) {
	ctx := context.Background()
	c := dbtest.StartCluster(t)
	admin, err := pgx.Connect(ctx, c.URL())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Exec(ctx, "CREATE DATABASE idemd_vault"); err != nil {
		t.Fatal(err)
	}
	admin.Close(ctx)
	dbURL := dbtest.WithDatabase(c.URL(), "idemd_vault")
	if err := dbtest.ApplyRoles(ctx, dbURL); err != nil {
		t.Fatal(err)
	}
	adminPool, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer adminPool.Close()
	migratorURL := dbtest.MigratorURL(dbURL)
	if err := c.RequirePasswords(); err != nil {
		t.Fatal(err)
	}
	testwait.Until(t, time.Minute, "the server to refuse a login without a password", func() bool {
		conn, err := pgx.Connect(ctx, migratorURL)
		if err == nil {
			conn.Close(ctx)
			return false
		}
		return strings.Contains(err.Error(), "password")
	})

	owned := func(role string) int {
		t.Helper()
		var n int
		if err := adminPool.QueryRow(ctx, ownedSQL, role).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	schemaVersion := func() int64 {
		t.Helper()
		s, err := migrate.Inspect(ctx, adminPool, migrate.Newest())
		if err != nil {
			t.Fatal(err)
		}
		return s.Database
	}
	// Vault's creation statement (docs/operations.md), with the names
	// and password it would generate.
	lease := func(n int) (string, string) {
		t.Helper()
		name := fmt.Sprintf("v-idemd-migr-%d", n)
		pw := leasePassword(t)
		stmt := fmt.Sprintf(`CREATE ROLE %s WITH LOGIN PASSWORD '%s' VALID UNTIL '%s' IN ROLE idemd_migrator`,
			pgx.Identifier{name}.Sanitize(), pw, time.Now().Add(time.Hour).UTC().Format(time.RFC3339))
		if _, err := adminPool.Exec(ctx, stmt); err != nil {
			t.Fatal(err)
		}
		return name, pw
	}
	// Vault's revocation: the role goes, and DROP ROLE fails while it
	// owns anything.
	revoke := func(name string) {
		t.Helper()
		if n := owned(name); n != 0 {
			t.Errorf("%s owns %d objects after its migration; want 0", name, n)
		}
		if _, err := adminPool.Exec(ctx, "DROP ROLE "+pgx.Identifier{name}.Sanitize()); err != nil {
			t.Errorf("DROP ROLE %s: %v", name, err)
		}
	}

	// Lease 1: a release behind migrates a new database.
	name, pw := lease(1)
	leaseURL := withUser(t, dbURL, name, pw)
	pool, err := pgxpool.New(ctx, leaseURL)
	if err != nil {
		t.Fatal(err)
	}
	_, err = migrate.Up(ctx, pool, migrate.Options{Target: olderRelease})
	pool.Close()
	if err != nil {
		t.Fatalf("migrate as %s to %d: %v", name, olderRelease, err)
	}
	if got := schemaVersion(); got != olderRelease {
		t.Fatalf("after the first lease the schema is at %d, want %d", got, olderRelease)
	}
	revoke(name)

	// Leases 2 and 3: this release's `idemctl migrate`, with the user and
	// password in files, as the chart mounts them.
	for n := 2; n <= 3; n++ {
		name, pw := lease(n)
		dir := t.TempDir()
		userFile, pwFile := filepath.Join(dir, "username"), filepath.Join(dir, "password")
		if err := os.WriteFile(userFile, []byte(name+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(pwFile, []byte(pw+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		code, out, errOut := run(t, "migrate", "--database-url", migratorURL,
			"--database-user-file", userFile, "--database-password-file", pwFile)
		if code != 0 {
			t.Fatalf("idemctl migrate as %s: exit %d\nstdout: %s\nstderr: %s", name, code, out, errOut)
		}
		if got := schemaVersion(); got != migrate.Newest() {
			t.Fatalf("after lease %d the schema is at %d, want %d", n, got, migrate.Newest())
		}
		revoke(name)
	}

	// Every idemd and River relation, function and type in public belongs
	// to the group role, which outlives every lease.
	var strays []string
	rows, err := adminPool.Query(ctx, `
SELECT c.relname || ' (' || c.relowner::regrole::text || ')' FROM pg_catalog.pg_class c
WHERE c.relnamespace = 'public'::regnamespace AND c.relowner <> to_regrole('idemd_migrator')
UNION ALL
SELECT p.proname || ' (' || p.proowner::regrole::text || ')' FROM pg_catalog.pg_proc p
WHERE p.pronamespace = 'public'::regnamespace AND p.proowner <> to_regrole('idemd_migrator')`)
	if err != nil {
		t.Fatal(err)
	}
	if strays, err = pgx.CollectRows(rows, pgx.RowTo[string]); err != nil {
		t.Fatal(err)
	}
	if len(strays) > 0 {
		t.Errorf("objects in public not owned by idemd_migrator: %v", strays)
	}
	if n := owned("idemd_migrator"); n == 0 {
		t.Error("idemd_migrator owns nothing: the oracle's query finds no objects at all")
	}
	// The migrator's default privileges applied: what a lease created is
	// the runtime's to use.
	var canInsert bool
	if err := adminPool.QueryRow(ctx, `SELECT has_table_privilege('idemd_runtime', 'idemd_reaper_runs', 'INSERT')`).Scan(&canInsert); err != nil {
		t.Fatal(err)
	}
	if !canInsert {
		t.Error("idemd_runtime may not insert into idemd_reaper_runs, created by a lease")
	}

	// Through a transaction-mode pooler (--pooler transaction) a session's
	// SET ROLE cannot hold: a lease is refused there unless its creation
	// statements make idemd_migrator its default role, as the docs say.
	name, pw = lease(4)
	pool, err = pgxpool.New(ctx, withUser(t, dbURL, name, pw))
	if err != nil {
		t.Fatal(err)
	}
	_, err = migrate.Up(ctx, pool, migrate.Options{TransactionPooler: true})
	pool.Close()
	var roleErr *migrate.RoleError
	if !errors.As(err, &roleErr) || !strings.Contains(err.Error(), "transaction-mode pooler") {
		t.Errorf("migrate as %s through a transaction pooler: %v, want a refusal naming the pooler", name, err)
	}
	if _, err := adminPool.Exec(ctx, fmt.Sprintf("ALTER ROLE %s SET role = 'idemd_migrator'", pgx.Identifier{name}.Sanitize())); err != nil {
		t.Fatal(err)
	}
	pool, err = pgxpool.New(ctx, withUser(t, dbURL, name, pw))
	if err != nil {
		t.Fatal(err)
	}
	_, err = migrate.Up(ctx, pool, migrate.Options{TransactionPooler: true})
	pool.Close()
	if err != nil {
		t.Errorf("migrate as %s with role = idemd_migrator through a transaction pooler: %v", name, err)
	}
	revoke(name)

	// The runtime's credentials wired to the migration Job by mistake.
	rpw := leasePassword(t)
	if _, err := adminPool.Exec(ctx, fmt.Sprintf("ALTER ROLE idemd_runtime PASSWORD '%s'", rpw)); err != nil {
		t.Fatal(err)
	}
	code, _, errOut := run(t, "migrate", "--database-url", withUser(t, dbURL, "idemd_runtime", rpw))
	if code != daemon.ExitConfig || !strings.Contains(errOut, "not a member of idemd_migrator") {
		t.Errorf("idemctl migrate as idemd_runtime: exit %d, stderr %q; want exit %d naming idemd_migrator", code, errOut, daemon.ExitConfig)
	}
}

// withUser is rawURL with the user and password replaced.
func withUser(t *testing.T, rawURL, user, password string) string {
	t.Helper()
	cfg, err := pgx.ParseConfig(rawURL)
	if err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("postgres://%s:%s@%s:%d/%s?sslmode=disable", user, password, cfg.Host, cfg.Port, cfg.Database)
}

func leasePassword(t *testing.T) string {
	t.Helper()
	b := make([]byte, 12)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return "A1a-" + hex.EncodeToString(b)
}
