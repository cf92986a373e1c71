package reaper

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/idemd/idemd/internal/testing/dbtest"
)

// TestWALCompression: the run's batches compress their WAL with
// --wal-compression when the role may set it (superuser, or PostgreSQL 15's
// GRANT SET ON PARAMETER), go on with the server's setting and say why when
// it may not, and leave the pooled connection as they found it (the setting
// is local to each batch's transaction). The oracle is PostgreSQL's own
// setting on the connection the batches run on.
func TestWALCompression(t *testing.T) {
	runtimeURL := dbtest.NewDatabase(t)
	// The test creates a role and compares with a superuser's session:
	// the admin's URL. The last subtest runs as the runtime role.
	dbURL := dbtest.AdminURL(t, runtimeURL)
	ctx := context.Background()
	admin, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
	var server string
	if err := admin.QueryRow(ctx, "SHOW wal_compression").Scan(&server); err != nil {
		t.Fatal(err)
	}
	if server == "lz4" {
		t.Fatalf("the test server already runs with wal_compression=lz4; the test could not tell the reaper's setting from it")
	}

	// A role with exactly the privileges docs/reaper.md lists, so a run
	// under it also checks that list.
	// Roles are shared by the whole server; the test's database name is
	// unique to this test, so the role named after it is too.
	var role string
	if err := admin.QueryRow(ctx, "SELECT current_database() || '_reaper'").Scan(&role); err != nil {
		t.Fatal(err)
	}
	r := pgx.Identifier{role}.Sanitize()
	if _, err := admin.Exec(ctx, "CREATE ROLE "+r+" LOGIN"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// Roles outlive the test's database, and a role holding privileges
		// cannot be dropped: revoke them all, then drop it.
		ctx := context.Background()
		conn, err := pgx.Connect(ctx, dbURL)
		if err != nil {
			t.Errorf("drop role %s: %v", role, err)
			return
		}
		defer conn.Close(ctx)
		for _, q := range []string{
			"DROP OWNED BY " + r,
			"REVOKE SET ON PARAMETER wal_compression FROM " + r,
			"DROP ROLE " + r,
		} {
			if _, err := conn.Exec(ctx, q); err != nil {
				t.Errorf("%s: %v", q, err)
			}
		}
	})
	for _, q := range []string{
		"GRANT SELECT, DELETE ON idempotency_keys TO " + r,
		"GRANT SELECT, INSERT ON idempotency_key_reviews TO " + r,
		"GRANT USAGE ON SEQUENCE idempotency_key_reviews_id_seq TO " + r,
		"GRANT SELECT, INSERT, UPDATE, DELETE ON idemd_leases TO " + r,
		"GRANT SELECT, INSERT, UPDATE, DELETE ON idemd_reaper_runs TO " + r,
		"GRANT USAGE ON SEQUENCE idemd_reaper_runs_id_seq TO " + r,
		"GRANT SELECT ON idemd_reaper_pause TO " + r,
	} {
		if _, err := admin.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	cfg, err := pgxpool.ParseConfig(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 1 // the run's connection is the one checked afterwards
	superPool, err := pgxpool.NewWithConfig(ctx, cfg.Copy())
	if err != nil {
		t.Fatal(err)
	}
	defer superPool.Close()
	cfg.ConnConfig.User = role
	rolePool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer rolePool.Close()

	// run does one run on pool, returns the session's wal_compression
	// while the run held the lock, the connection's afterwards, and what
	// the run logged. The connection afterwards must be the run's own
	// session, not a replacement for one the run had to close.
	run := func(t *testing.T, pool *pgxpool.Pool, setting string) (during, after string, logs *observer.ObservedLogs) {
		t.Helper()
		insertOldKeys(t, superPool, 30)
		s := testSettings()
		s.WALCompression = setting
		core, logs := observer.New(zap.InfoLevel)
		svc, err := New(Config{Settings: s, Pool: pool, Logger: zap.New(core), Registry: prometheus.NewRegistry()})
		if err != nil {
			t.Fatal(err)
		}
		var pidDuring, pidAfter int
		svc.hooks.inBatch = func(ctx context.Context, tx pgx.Tx) {
			if err := tx.QueryRow(ctx, "SELECT current_setting('wal_compression'), pg_backend_pid()").Scan(&during, &pidDuring); err != nil {
				t.Errorf("wal_compression during the run: %v", err)
			}
		}
		res, err := svc.RunOnce(ctx)
		if err != nil || res.Deleted != 30 {
			t.Fatalf("run: %+v, %v", res, err)
		}
		if err := pool.QueryRow(ctx, "SELECT current_setting('wal_compression'), pg_backend_pid()").Scan(&after, &pidAfter); err != nil {
			t.Fatal(err)
		}
		if pidAfter != pidDuring {
			t.Fatalf("the run's session (pid %d) did not go back to the pool (now pid %d): %v", pidDuring, pidAfter, logs.FilterLevelExact(zap.WarnLevel).All())
		}
		return during, after, logs
	}
	refused := func(logs *observer.ObservedLogs) int {
		return logs.FilterMessageSnippet("could not set wal_compression").Len()
	}

	t.Run("superuser", func(t *testing.T) {
		during, after, logs := run(t, superPool, "lz4")
		if during != "lz4" || after != server || refused(logs) != 0 {
			t.Fatalf("during %q, after %q (server %q), refusals logged %d", during, after, server, refused(logs))
		}
	})
	t.Run("server setting kept", func(t *testing.T) {
		during, after, logs := run(t, superPool, "server")
		if during != server || after != server || refused(logs) != 0 {
			t.Fatalf("during %q, after %q (server %q), refusals logged %d", during, after, server, refused(logs))
		}
	})
	t.Run("role without the privilege", func(t *testing.T) {
		during, after, logs := run(t, rolePool, "lz4")
		if during != server || after != server || refused(logs) != 1 {
			t.Fatalf("during %q, after %q (server %q), refusals logged %d", during, after, server, refused(logs))
		}
	})
	t.Run("idemd_runtime, granted by deploy/sql/roles.sql", func(t *testing.T) {
		rcfg, err := pgxpool.ParseConfig(runtimeURL)
		if err != nil {
			t.Fatal(err)
		}
		rcfg.MaxConns = 1
		runtimePool, err := pgxpool.NewWithConfig(ctx, rcfg)
		if err != nil {
			t.Fatal(err)
		}
		defer runtimePool.Close()
		during, after, logs := run(t, runtimePool, "lz4")
		if during != "lz4" || after != server || refused(logs) != 0 {
			t.Fatalf("during %q, after %q (server %q), refusals logged %d", during, after, server, refused(logs))
		}
	})
	t.Run("role granted SET ON PARAMETER", func(t *testing.T) {
		if _, err := admin.Exec(ctx, "GRANT SET ON PARAMETER wal_compression TO "+r); err != nil {
			t.Fatal(err)
		}
		during, after, logs := run(t, rolePool, "pglz")
		if during != "pglz" || after != server || refused(logs) != 0 {
			t.Fatalf("during %q, after %q (server %q), refusals logged %d", during, after, server, refused(logs))
		}
	})
}
