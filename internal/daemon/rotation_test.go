package daemon_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	rolesql "github.com/idemd/idemd/deploy/sql"
	"github.com/idemd/idemd/internal/migrate"
	"github.com/idemd/idemd/internal/testing/dbtest"
	"github.com/idemd/idemd/internal/testing/testwait"
)

// rotationDatabase starts a private cluster (its authentication is
// changed by the test) with a migrated database, the roles of
// deploy/sql/roles.sql, and returns the database's URL and a pool on it as
// the cluster's admin.
func rotationDatabase(t *testing.T, name string) (*dbtest.Cluster, string, *pgxpool.Pool) {
	t.Helper()
	ctx := context.Background()
	c := dbtest.StartCluster(t)
	admin, err := pgx.Connect(ctx, c.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		t.Fatal(err)
	}
	dbURL := dbtest.WithDatabase(c.URL(), name)
	if err := dbtest.ApplyRoles(ctx, dbURL); err != nil {
		t.Fatal(err)
	}
	adminPool, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(adminPool.Close)
	// As in production, the migrator owns the schema and grants the
	// runtime role its privileges (still trusted: passwords come next).
	migrator, err := pgxpool.New(ctx, dbtest.AsRole(dbURL, dbtest.MigratorRole))
	if err != nil {
		t.Fatal(err)
	}
	_, err = migrate.Up(ctx, migrator, migrate.Options{})
	migrator.Close()
	if err != nil {
		t.Fatal(err)
	}
	return c, dbURL, adminPool
}

// secretVolume writes credentials the way the kubelet updates a Secret
// mounted as a volume (and the Vault agent's file sink, by rename): each
// version in a directory of its own, the visible files symlinks through
// "..data", which one rename swaps to the new version. Readers see the
// old pair or the new pair, never a file half written, but two files read
// one after the other may straddle a swap.
type secretVolume struct {
	dir     string
	version int
}

func (v *secretVolume) write(t *testing.T, files map[string]string) {
	t.Helper()
	v.version++
	ver := fmt.Sprintf("..v%d", v.version)
	if err := os.Mkdir(filepath.Join(v.dir, ver), 0o700); err != nil {
		t.Fatal(err)
	}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(v.dir, ver, name), []byte(content+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		link := filepath.Join(v.dir, name)
		if _, err := os.Lstat(link); os.IsNotExist(err) {
			if err := os.Symlink(filepath.Join("..data", name), link); err != nil {
				t.Fatal(err)
			}
		}
	}
	tmp := filepath.Join(v.dir, "..data_tmp")
	if err := os.Symlink(ver, tmp); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(v.dir, "..data")); err != nil {
		t.Fatal(err)
	}
	if v.version > 1 {
		if err := os.RemoveAll(filepath.Join(v.dir, fmt.Sprintf("..v%d", v.version-1))); err != nil {
			t.Fatal(err)
		}
	}
}

// requirePasswords makes the cluster ask every role but its admin for a
// password, and waits until a login to url (which has none) is refused.
func requirePasswords(t *testing.T, c *dbtest.Cluster, url string) {
	t.Helper()
	if err := c.RequirePasswords(); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	testwait.Until(t, time.Minute, "the server to refuse a login without a password", func() bool {
		conn, err := pgx.Connect(ctx, url)
		if err == nil {
			conn.Close(ctx)
			return false
		}
		return strings.Contains(err.Error(), "password")
	})
}

func randomPassword(t *testing.T) string {
	t.Helper()
	b := make([]byte, 12)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return "rot-" + hex.EncodeToString(b)
}

// TestRotationUnderLoadFailsNoPass is the rotation that costs nothing:
// two login roles, members of idemd_runtime, used in turn (Vault's and
// AWS Secrets Manager's "alternating users"). Each rotation sets a new
// password on the role not in use, then swaps both files at once, as the
// kubelet does; the role the files left keeps its password (and its open
// sessions) until the next rotation. The enqueuer, the completer and the
// reaper run with pool_max_conn_lifetime=1s, so they open connections
// all the time, while staged jobs arrive. A daemon that kept a credential
// past the next rotation would be refused. The oracle is the database's:
// after every rotation each daemon holds a session as the new role
// (pg_stat_activity), and at the end every staged job is in river_job;
// the daemons log no failed pass, no refused login, and count none.
func TestRotationUnderLoadFailsNoPass(t *testing.T) {
	ctx := context.Background()
	c, dbURL, adminPool := rotationDatabase(t, "idemd_rotate_load")
	// The documented file, run as an operator would.
	if _, err := adminPool.Exec(ctx, rolesql.RuntimeRolesInTurn); err != nil {
		t.Fatal(err)
	}
	roles := []string{"idemd_runtime_a", "idemd_runtime_b"}
	setPassword := func(role, pw string) {
		t.Helper()
		if _, err := adminPool.Exec(ctx, fmt.Sprintf("ALTER ROLE %s PASSWORD '%s'", pgx.Identifier{role}.Sanitize(), pw)); err != nil {
			t.Fatal(err)
		}
	}
	pw := randomPassword(t)
	var passwords []string
	setPassword(roles[0], pw)
	passwords = append(passwords, pw)
	// The URL names a role the files replace; it has no password.
	baseURL := dbtest.AsRole(dbURL, dbtest.RuntimeRole)
	requirePasswords(t, c, baseURL)
	vol := &secretVolume{dir: t.TempDir()}
	vol.write(t, map[string]string{"username": roles[0], "password": pw})

	secret := filepath.Join(t.TempDir(), "auth-secret")
	if err := os.WriteFile(secret, []byte("rotation-test-replay-secret-0123456789"), 0o600); err != nil {
		t.Fatal(err)
	}
	// New connections all the time: each lives a second, and the health
	// check closes expired idle ones five times a second.
	dbArgs := []string{"--database-url", baseURL + "&pool_max_conn_lifetime=1s&pool_health_check_period=200ms",
		"--database-password-file", filepath.Join(vol.dir, "password"),
		"--database-user-file", filepath.Join(vol.dir, "username")}
	daemons := []*daemonProcess{
		startDaemon(t, "enqueuer", append(dbArgs, "--sweep-interval", "200ms")...),
		startDaemon(t, "completer", append(dbArgs, "--api-url", "http://127.0.0.1:1", "--auth-secret-file", secret, "--poll-interval", "200ms")...),
		startDaemon(t, "reaper", append(dbArgs, "--schedule", "@every 1s")...),
	}

	// The API's load: a staged job every 10 ms until the rotations end.
	loadCtx, stopLoad := context.WithCancel(ctx)
	var wg sync.WaitGroup
	var staged int
	var loadErr error
	wg.Add(1)
	go func() {
		defer wg.Done()
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-loadCtx.Done():
				return
			case <-tick.C:
			}
			if _, err := adminPool.Exec(ctx, `INSERT INTO staged_jobs (job_name, job_args) VALUES ('rotate', jsonb_build_object('i', $1::int))`, staged); err != nil {
				loadErr = err
				return
			}
			staged++
		}
	}()

	// sessionsAs says whether every daemon holds a session as role opened
	// after since. The roles alternate, so a session of the same role from
	// two rotations ago must not count: a daemon that had not yet read the
	// files would pass, and the next rotation would overtake it.
	sessionsAs := func(role string, since time.Time) bool {
		var n int
		if err := adminPool.QueryRow(ctx, `SELECT count(DISTINCT application_name) FROM pg_stat_activity WHERE usename = $1 AND backend_start > $2 AND application_name IN ('idemd-enqueuer', 'idemd-completer', 'idemd-reaper')`, role, since).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n == 3
	}
	testwait.Until(t, 2*time.Minute, "every daemon to log in as the first role", func() bool { return sessionsAs(roles[0], time.Time{}) })

	const rotations = 6
	for i := 1; i <= rotations; i++ {
		next := roles[i%2]
		pw := randomPassword(t)
		// The role not in use gets its new password; the old password of
		// that role, which the files held two rotations ago, stops working.
		setPassword(next, pw)
		passwords = append(passwords, pw)
		var rotatedAt time.Time
		if err := adminPool.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&rotatedAt); err != nil {
			t.Fatal(err)
		}
		vol.write(t, map[string]string{"username": next, "password": pw})
		testwait.Until(t, 2*time.Minute, fmt.Sprintf("rotation %d: every daemon to log in as %s", i, next), func() bool { return sessionsAs(next, rotatedAt) })
	}
	stopLoad()
	wg.Wait()
	if loadErr != nil {
		t.Fatal(loadErr)
	}
	testwait.Until(t, 2*time.Minute, "every staged job to reach River", func() bool {
		var n int
		if err := adminPool.QueryRow(ctx, `SELECT count(*) FROM river_job WHERE kind = 'rotate'`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n == staged
	})
	if staged < rotations {
		t.Fatalf("only %d jobs staged during %d rotations: the load did not run", staged, rotations)
	}
	for _, d := range daemons {
		if v, ok := d.metric("idemd_database_auth_failures_total"); !ok || v != 0 {
			t.Errorf("%s: idemd_database_auth_failures_total %v (read %v), want 0", d.name, v, ok)
		}
		d.stop(t)
		log := d.logs.String()
		for _, line := range strings.Split(log, "\n") {
			if strings.Contains(line, `"level":"error"`) || strings.Contains(line, "refused a new connection") {
				t.Errorf("%s failed during the rotations: %s", d.name, line)
			}
		}
		for _, pw := range passwords {
			if strings.Contains(log, pw) {
				t.Errorf("%s logged a password", d.name)
			}
		}
		if n := strings.Count(log, "the database credentials file changed"); n != rotations {
			t.Errorf("%s says %d times that the credentials changed, want once per rotation (%d)", d.name, n, rotations)
		}
	}
	t.Logf("%d rotations, %d jobs staged and moved", rotations, staged)
}
