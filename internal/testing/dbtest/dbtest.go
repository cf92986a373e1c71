// Package dbtest gives each test a fresh, fully migrated PostgreSQL database.
//
// The server is found in this order (docs/design.md, "Tests and the database"):
//  1. TEST_DATABASE_URL, when set;
//  2. a local server on 127.0.0.1:5432 (user postgres, trust auth);
//  3. a throwaway cluster started with the local initdb/pg_ctl;
//  4. testcontainers-go, on a machine with a Docker engine.
//
// A template database is migrated once per migration set (its name carries a
// hash of the migrations) and every test gets CREATE DATABASE ... TEMPLATE,
// which costs a file copy rather than a migration run. With CI=true and no
// server reachable, tests fail; they never skip.
//
// The template gets deploy/sql/roles.sql and is migrated as idemd_migrator
// (which applies deploy/sql/grants.sql, as `idemctl migrate` does), and tests connect as idemd_runtime, the daemons' role in production
// (docs/operations.md, "Database roles"): the suites prove those grants are
// enough. AdminURL and MigratorURL are for the setup a daemon never does.
package dbtest

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io/fs"

	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"

	rolesql "github.com/idemd/idemd/deploy/sql"
	"github.com/idemd/idemd/internal/migrate"
	"github.com/idemd/idemd/internal/testing/scratchdb"
	"github.com/idemd/idemd/internal/testing/testbin"
)

const localURL = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"

var (
	serverOnce sync.Once
	serverURL  string // admin URL of the server in use, database "postgres"
	serverErr  error
	stopServer func()

	templateMu    sync.Mutex
	templateReady = map[string]bool{}
)

// Main wraps a package's TestMain: it runs the tests, removes the binaries
// testbin built, stops any server this process started, and then checks for
// leaked goroutines.
func Main(m *testing.M) {
	code := m.Run()
	testbin.RemoveAll()
	if stopServer != nil {
		stopServer()
	}
	if code == 0 {
		code = verifyNoLeaks()
	}
	os.Exit(code)
}

// ServerURL returns the admin URL (database "postgres") of the server tests
// use, starting one if needed. It fails the test when none can be had.
func ServerURL(tb testing.TB) string {
	tb.Helper()
	serverOnce.Do(func() { serverURL, stopServer, serverErr = findServer() })
	if serverErr != nil {
		tb.Fatalf("dbtest: no PostgreSQL for tests: %v", serverErr)
	}
	return serverURL
}

// NewDatabase creates a fresh migrated database, drops it when the test ends,
// and returns its URL as RuntimeRole (AdminURL and MigratorURL give the
// same database as the other roles).
func NewDatabase(tb testing.TB) string {
	tb.Helper()
	admin := ServerURL(tb)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	tmpl, err := ensureTemplate(ctx, admin)
	if err != nil {
		tb.Fatalf("dbtest: template: %v", err)
	}
	name := "idemd_test_" + randomHex(6)
	if err := execAdmin(ctx, admin, fmt.Sprintf("CREATE DATABASE %s TEMPLATE %s", pgx.Identifier{name}.Sanitize(), pgx.Identifier{tmpl}.Sanitize())); err != nil {
		tb.Fatalf("dbtest: create database: %v", err)
	}
	dropWhenDone(tb, admin, name)
	return RuntimeURL(WithDatabase(admin, name))
}

// NewEmptyDatabase creates a database without idemd's or River's schema
// but prepared as deploy/sql/roles.sql prepares one before its first
// `idemctl migrate` (the roles exist, the migrator may create in it),
// drops it when the test ends, and returns its URL as the superuser
// (MigratorURL and RuntimeURL give it as the other roles).
func NewEmptyDatabase(tb testing.TB) string {
	tb.Helper()
	admin := ServerURL(tb)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	// The template's build creates the roles, once per server.
	if _, err := ensureTemplate(ctx, admin); err != nil {
		tb.Fatalf("dbtest: template: %v", err)
	}
	name := "idemd_empty_" + randomHex(6)
	if err := execAdmin(ctx, admin, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		tb.Fatalf("dbtest: create database: %v", err)
	}
	dropWhenDone(tb, admin, name)
	u := WithDatabase(admin, name)
	if err := ApplyRoles(ctx, u); err != nil {
		tb.Fatal(err)
	}
	return u
}

// dropWhenDone drops database name when the test ends.
func dropWhenDone(tb testing.TB, admin, name string) {
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := execAdmin(ctx, admin, fmt.Sprintf("DROP DATABASE IF EXISTS %s WITH (FORCE)", pgx.Identifier{name}.Sanitize())); err != nil {
			tb.Logf("dbtest: drop database %s: %v", name, err)
		}
	})
}

// NewPool creates a fresh migrated database and a pool on it as RuntimeRole,
// both closed when the test ends.
func NewPool(tb testing.TB) *pgxpool.Pool {
	tb.Helper()
	dbURL := NewDatabase(tb)
	pool, err := pgxpool.New(context.Background(), dbURL)
	if err != nil {
		tb.Fatalf("dbtest: pool: %v", err)
	}
	tb.Cleanup(pool.Close)
	return pool
}

// WithDatabase returns rawURL with its database replaced.
func WithDatabase(rawURL, database string) string {
	u, err := scratchdb.WithDatabase(rawURL, database, "")
	if err != nil {
		panic(fmt.Sprintf("dbtest: %v", err))
	}
	return u
}

func findServer() (string, func(), error) {
	if u := os.Getenv("TEST_DATABASE_URL"); u != "" {
		if err := ping(u); err != nil {
			return "", nil, fmt.Errorf("TEST_DATABASE_URL is set but unreachable: %w", err)
		}
		return u, nil, nil
	}
	if err := ping(localURL); err == nil {
		return localURL, nil, nil
	}
	var problems []string
	u, stop, err := startLocalCluster()
	if err == nil {
		return u, stop, nil
	}
	problems = append(problems, "local cluster: "+err.Error())
	u, stop, err = startContainer()
	if err == nil {
		return u, stop, nil
	}
	problems = append(problems, "testcontainers: "+err.Error())
	return "", nil, fmt.Errorf("nothing on 127.0.0.1:5432 and TEST_DATABASE_URL unset; %s", strings.Join(problems, "; "))
}

func ping(u string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, u)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	return conn.Ping(ctx)
}

func execAdmin(ctx context.Context, admin, sql string) error {
	conn, err := pgx.Connect(ctx, admin)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, sql)
	return err
}

// migrationsHash names the template after everything that shapes the schema,
// so a changed migration or River upgrade gets a new template.
func migrationsHash() (string, error) {
	h := sha256.New()
	err := fs.WalkDir(migrate.Files(), ".", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := fs.ReadFile(migrate.Files(), path)
		if err != nil {
			return err
		}
		fmt.Fprintf(h, "%s\x00%s\x00", path, b)
		return nil
	})
	if err != nil {
		return "", err
	}
	m, err := rivermigrate.New(riverpgxv5.New(nil), nil)
	if err != nil {
		return "", err
	}
	for _, v := range m.AllVersions() {
		fmt.Fprintf(h, "river%d\x00%s\x00", v.Version, v.SQLUp)
	}
	// The roles and grants are part of the template too.
	fmt.Fprintf(h, "roles\x00%s\x00grants\x00%s\x00", rolesql.Roles, rolesql.Grants)
	return hex.EncodeToString(h.Sum(nil))[:16], nil
}

const templateLockKey int64 = 0x6964656d64746d70 // "idemdtmp"

func ensureTemplate(ctx context.Context, admin string) (string, error) {
	hash, err := migrationsHash()
	if err != nil {
		return "", fmt.Errorf("hash migrations: %w", err)
	}
	tmpl := "idemd_tmpl_" + hash

	templateMu.Lock()
	defer templateMu.Unlock()
	if templateReady[tmpl] {
		return tmpl, nil
	}

	// Test binaries of several packages run in parallel processes: serialise
	// template creation across them with an advisory lock.
	conn, err := pgx.Connect(ctx, admin)
	if err != nil {
		return "", err
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "SELECT pg_advisory_lock($1)", templateLockKey); err != nil {
		return "", err
	}
	defer conn.Exec(context.WithoutCancel(ctx), "SELECT pg_advisory_unlock($1)", templateLockKey) //nolint:errcheck

	var exists bool
	if err := conn.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)", tmpl).Scan(&exists); err != nil {
		return "", err
	}
	if !exists {
		// Build under a temporary name and rename when complete, so a
		// crashed build never leaves a half-migrated template behind.
		building := tmpl + "_b" + randomHex(3)
		if _, err := conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{building}.Sanitize()); err != nil {
			return "", err
		}
		// roles.sql also creates the roles, which belong to the cluster:
		// a template exists only where its roles were created (its name
		// hashes the file), and the template itself is never connected to
		// again, since CREATE DATABASE ... TEMPLATE fails while it is.
		buildingURL := WithDatabase(admin, building)
		err := ApplyRoles(ctx, buildingURL)
		if err == nil {
			// As the migrator, like `idemctl migrate` in production, so
			// every object is the migrator's, the default privileges of
			// roles.sql grant it to the runtime, and the migration's own
			// grants step (grants.sql) gives the API group its share.
			err = migrateDatabase(ctx, MigratorURL(buildingURL))
		}
		if err != nil {
			conn.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{building}.Sanitize()+" WITH (FORCE)") //nolint:errcheck
			return "", fmt.Errorf("migrate template: %w", err)
		}
		if _, err := conn.Exec(ctx, fmt.Sprintf("ALTER DATABASE %s RENAME TO %s", pgx.Identifier{building}.Sanitize(), pgx.Identifier{tmpl}.Sanitize())); err != nil {
			return "", err
		}
	}
	templateReady[tmpl] = true
	return tmpl, nil
}

func migrateDatabase(ctx context.Context, dbURL string) error {
	pool, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		return err
	}
	defer pool.Close()
	_, err = migrate.Up(ctx, pool, migrate.Options{})
	return err
}

func randomHex(n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	return hex.EncodeToString(b)
}

// AdvisoryLocks counts the advisory locks any session of pool's database
// holds. idemd takes none that could outlive a transaction, so a test
// checks it is 0 once the work under test is done.
func AdvisoryLocks(ctx context.Context, pool *pgxpool.Pool) (int, error) {
	var n int
	err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_locks l JOIN pg_database d ON d.oid = l.database
WHERE l.locktype = 'advisory' AND d.datname = current_database()`).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("dbtest: count advisory locks: %w", err)
	}
	return n, nil
}
