package dbtest

import (
	"context"
	"fmt"
	"net/url"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	rolesql "github.com/idemd/idemd/deploy/sql"
)

// The roles of deploy/sql/roles.sql. Tests run as RuntimeRole, the role the
// daemons get in production, so a privilege a daemon needs and the file
// does not grant fails a test instead of a deployment.
const (
	MigratorRole = rolesql.MigratorRole
	RuntimeRole  = rolesql.RuntimeRole
	APIRole      = rolesql.APIRole
)

// testPassword is given to the login roles only when the admin URL carries a
// password (a TEST_DATABASE_URL server with password authentication); the
// servers dbtest starts itself trust every local connection.
const testPassword = "idemd-test"

// rolesMu serialises ApplyRoles within the process, rolesLockKey across
// processes (an advisory lock in the server's postgres database: roles
// belong to the cluster, advisory locks to a database).
var rolesMu sync.Mutex

const rolesLockKey int64 = 0x6964656d64726f6c // "idemdrol"

// ApplyRoles runs deploy/sql/roles.sql, unchanged, in the database of
// adminURL (a superuser or the database owner): it creates the roles if
// missing (roles are per cluster) and grants them what they need in that
// database. It is idempotent and safe to run from several processes at
// once: it runs one at a time on a server, within a process (rolesMu) and
// across the test binaries of several packages (rolesLockKey), because
// concurrent GRANTs and ALTER ROLE PASSWORDs on the same roles fail with
// "tuple concurrently updated".
func ApplyRoles(ctx context.Context, adminURL string) error {
	rolesMu.Lock()
	defer rolesMu.Unlock()
	lock, err := pgx.Connect(ctx, WithDatabase(adminURL, "postgres"))
	if err != nil {
		return fmt.Errorf("dbtest: roles: connect for the lock: %w", err)
	}
	// Closing the session releases its advisory lock.
	defer lock.Close(context.WithoutCancel(ctx))
	if _, err := lock.Exec(ctx, "SELECT pg_advisory_lock($1)", rolesLockKey); err != nil {
		return fmt.Errorf("dbtest: roles: lock: %w", err)
	}
	conn, err := pgx.Connect(ctx, adminURL)
	if err != nil {
		return fmt.Errorf("dbtest: roles: connect: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	// Exec without arguments uses the simple protocol, which runs the
	// file's several statements in one call, as psql -f would.
	if _, err := conn.Exec(ctx, rolesql.Roles); err != nil {
		return fmt.Errorf("dbtest: apply deploy/sql/roles.sql: %w", err)
	}
	if hasPassword(adminURL) {
		for _, r := range []string{MigratorRole, RuntimeRole} {
			if _, err := conn.Exec(ctx, fmt.Sprintf("ALTER ROLE %s PASSWORD '%s'", pgx.Identifier{r}.Sanitize(), testPassword)); err != nil {
				return fmt.Errorf("dbtest: roles: password of %s: %w", r, err)
			}
		}
	}
	return nil
}

// AsRole returns rawURL (any database URL of the test server) logging in as
// role instead. For MigratorRole and RuntimeRole only: they are the roles
// that log in.
func AsRole(rawURL, role string) string {
	u, err := url.Parse(rawURL)
	if err != nil {
		panic(fmt.Sprintf("dbtest: parse database url: %v", err))
	}
	if hasPassword(rawURL) {
		u.User = url.UserPassword(role, testPassword)
	} else {
		u.User = url.User(role)
	}
	return u.String()
}

// AdminURL returns dbURL (a URL from NewDatabase, any role) as the server's
// admin, a superuser on the servers dbtest finds. Only for what no idemd
// component may do and a test must: create roles, CHECKPOINT, ALTER a table
// to set up a fault, read other roles' sessions.
func AdminURL(tb testing.TB, dbURL string) string {
	tb.Helper()
	admin, err := url.Parse(ServerURL(tb))
	if err != nil {
		tb.Fatalf("dbtest: parse admin url: %v", err)
	}
	u, err := url.Parse(dbURL)
	if err != nil {
		tb.Fatalf("dbtest: parse database url: %v", err)
	}
	u.User = admin.User
	return u.String()
}

// MigratorURL returns dbURL as MigratorRole: the role that owns idemd's
// schema. Tests create their own tables with it (Rocket Rides' tables, a
// test table), so the default privileges grant them to RuntimeRole as they
// would grant a later migration's.
func MigratorURL(dbURL string) string { return AsRole(dbURL, MigratorRole) }

// RuntimeURL returns dbURL as RuntimeRole, the daemons' role.
func RuntimeURL(dbURL string) string { return AsRole(dbURL, RuntimeRole) }

func hasPassword(rawURL string) bool {
	u, err := url.Parse(rawURL)
	if err != nil || u.User == nil {
		return false
	}
	_, ok := u.User.Password()
	return ok
}

// MigratorPool opens a pool as MigratorRole on pool's database, closed when
// the test ends: for the setup `idemctl migrate` or an application's own
// migration does in production (Rocket Rides' tables, a test's table), so
// what it creates is granted to RuntimeRole like a migration's objects.
func MigratorPool(tb testing.TB, pool *pgxpool.Pool) *pgxpool.Pool {
	tb.Helper()
	return rolePool(tb, MigratorURL(pool.Config().ConnString()))
}

// AdminPool opens a pool as the server's admin on pool's database, closed
// when the test ends (see AdminURL for what it is for).
func AdminPool(tb testing.TB, pool *pgxpool.Pool) *pgxpool.Pool {
	tb.Helper()
	return rolePool(tb, AdminURL(tb, pool.Config().ConnString()))
}

func rolePool(tb testing.TB, dbURL string) *pgxpool.Pool {
	tb.Helper()
	p, err := pgxpool.New(context.Background(), dbURL)
	if err != nil {
		tb.Fatalf("dbtest: pool: %v", err)
	}
	tb.Cleanup(p.Close)
	return p
}
