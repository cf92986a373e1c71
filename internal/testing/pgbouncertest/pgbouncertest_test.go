package pgbouncertest

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemd/idemd/internal/testing/dbtest"
	"github.com/idemd/idemd/internal/testing/testwait"
)

func TestMain(m *testing.M) { dbtest.Main(m) }

// setup gives the test its own database and a pgbouncer in front of it. The
// database comes first so that its cleanup (DROP DATABASE) runs after
// pgbouncer's (stop): cleanups run last-registered first.
func setup(t *testing.T, opts Options) (*Bouncer, string) {
	t.Helper()
	db := DatabaseName(t, dbtest.NewDatabase(t))
	return Start(t, opts), db
}

func testCtx(t *testing.T) context.Context {
	// Bounds a hung test only; nothing asserts on durations.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// through connects through pgbouncer in the simple protocol, so the test's
// own client leaves only the state the test means to leave.
func through(t *testing.T, ctx context.Context, b *Bouncer, db string) *pgx.Conn {
	t.Helper()
	conn, err := connect(ctx, b.URL(db, "postgres"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

func execSQL(t *testing.T, ctx context.Context, conn *pgx.Conn, sql string) {
	t.Helper()
	if _, err := conn.Exec(ctx, sql); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

func backendPID(t *testing.T, ctx context.Context, conn *pgx.Conn) int {
	t.Helper()
	var pid int
	if err := conn.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
		t.Fatalf("pg_backend_pid: %v", err)
	}
	return pid
}

func leaks(t *testing.T, ctx context.Context, b *Bouncer, db string) []string {
	t.Helper()
	l, err := b.Leaks(ctx, db, "postgres")
	if err != nil {
		t.Fatalf("leaks: %v\n--- pgbouncer log tail:\n%s", err, b.LogTail(30))
	}
	return l
}

func wantLeak(t *testing.T, found []string, substr string) {
	t.Helper()
	for _, l := range found {
		if strings.Contains(l, substr) {
			return
		}
	}
	t.Errorf("no leak mentioning %q found; leaks: %q", substr, found)
}

// Two client connections, one server connection: in transaction mode both
// clients' queries run on the same backend, which session mode could never
// do (the first client would keep the only server connection).
func TestTransactionModeMultiplexes(t *testing.T) {
	b, db := setup(t, Options{PoolSize: 1})
	ctx := testCtx(t)
	a, c := through(t, ctx, b, db), through(t, ctx, b, db)
	pa, pc := backendPID(t, ctx, a), backendPID(t, ctx, c)
	if pa != pc {
		t.Fatalf("two clients on a pool of one got backends %d and %d", pa, pc)
	}
	st, err := b.Admin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	servers := st.ServersOf(db, "postgres")
	if len(servers) != 1 || servers[0].RemotePID != pa {
		t.Fatalf("SHOW SERVERS for %s: %+v; want the one backend %d", db, servers, pa)
	}
	var pool *Pool
	for i := range st.Pools {
		if st.Pools[i].Database == db && st.Pools[i].User == "postgres" {
			pool = &st.Pools[i]
		}
	}
	if pool == nil || pool.PoolMode != "transaction" || pool.ClActive != 2 {
		t.Fatalf("SHOW POOLS for %s: %+v; want transaction mode with 2 clients", db, pool)
	}
}

// Nothing done through pgbouncer: no leak. This is the baseline the leak
// tests below depart from, and it covers Defaults agreeing with a server
// connection pgbouncer opened.
func TestCleanPoolHasNoLeaks(t *testing.T) {
	b, db := setup(t, Options{})
	ctx := testCtx(t)
	conn := through(t, ctx, b, db)
	backendPID(t, ctx, conn)
	if l := leaks(t, ctx, b, db); len(l) != 0 {
		t.Fatalf("leaks on an untouched pool: %q", l)
	}
}

// A session-level setting made through pgbouncer stays on the server
// connection after the client is gone: the leak detector must say so.
func TestLeakedSettingDetected(t *testing.T) {
	b, db := setup(t, Options{})
	ctx := testCtx(t)
	conn := through(t, ctx, b, db)
	execSQL(t, ctx, conn, "SELECT set_config('wal_compression', 'pglz', false)")
	execSQL(t, ctx, conn, "SET statement_timeout = '17s'")
	conn.Close(ctx)

	found := leaks(t, ctx, b, db)
	wantLeak(t, found, `wal_compression = "pglz"`)
	wantLeak(t, found, `statement_timeout = "17s"`)
}

// pgbouncer tracks application_name (the server reports it) and sets it for
// each client that sent one at connect time, but never sets it back: a
// client that sent none gets whatever the server connection has, a name an
// earlier client SET or connected with. The detector sees that; Leaks'
// ignore list is for code that names its connections at connect time.
func TestApplicationName(t *testing.T) {
	b, db := setup(t, Options{PoolSize: 1})
	ctx := testCtx(t)
	conn := through(t, ctx, b, db)
	execSQL(t, ctx, conn, "SET application_name = 'leaky'")
	conn.Close(ctx)
	wantLeak(t, leaks(t, ctx, b, db), `application_name = "leaky"`)

	named, err := connect(ctx, b.URL(db, "postgres")+"&application_name=mine")
	if err != nil {
		t.Fatal(err)
	}
	defer named.Close(ctx)
	var name string
	if err := named.QueryRow(ctx, "SELECT current_setting('application_name')").Scan(&name); err != nil {
		t.Fatal(err)
	}
	if name != "mine" {
		t.Errorf("a client that connected as %q runs with application_name %q", "mine", name)
	}
	named.Close(ctx)
	wantLeak(t, leaks(t, ctx, b, db), `application_name = "mine"`)

	l, err := b.Leaks(ctx, db, "postgres", "application_name")
	if err != nil {
		t.Fatal(err)
	}
	if len(l) != 0 {
		t.Fatalf("leaks ignoring application_name: %q", l)
	}
}

func TestListenDetected(t *testing.T) {
	b, db := setup(t, Options{})
	ctx := testCtx(t)
	conn := through(t, ctx, b, db)
	execSQL(t, ctx, conn, "LISTEN pgbouncertest_foo")
	conn.Close(ctx)

	wantLeak(t, leaks(t, ctx, b, db), "LISTEN pgbouncertest_foo")
}

// A session advisory lock taken through pgbouncer outlives the client that
// took it: the server connection still holds it, and nobody can take it.
func TestAdvisoryLockDetected(t *testing.T) {
	b, db := setup(t, Options{})
	ctx := testCtx(t)
	conn := through(t, ctx, b, db)
	var got bool
	if err := conn.QueryRow(ctx, "SELECT pg_try_advisory_lock(4242)").Scan(&got); err != nil || !got {
		t.Fatalf("pg_try_advisory_lock through pgbouncer: %v, %v", got, err)
	}
	conn.Close(ctx)

	direct, err := pgx.Connect(ctx, b.DirectURL(db, "postgres"))
	if err != nil {
		t.Fatal(err)
	}
	defer direct.Close(ctx)
	if err := direct.QueryRow(ctx, "SELECT pg_try_advisory_lock(4242)").Scan(&got); err != nil {
		t.Fatal(err)
	}
	if got {
		t.Fatal("the lock taken through pgbouncer is free once its client is gone; want it still held by the server connection")
	}
	wantLeak(t, leaks(t, ctx, b, db), "advisory locks 0:4242:1 ExclusiveLock")
}

// pgx's default statement cache prepares a named statement on whichever
// server connection a query runs on; pgbouncer 1.18 knows nothing of it, so
// it stays there for the next client.
func TestPgxStatementCacheLeavesPreparedStatements(t *testing.T) {
	b, db := setup(t, Options{PoolSize: 1})
	ctx := testCtx(t)
	conn, err := pgx.Connect(ctx, b.URL(db, "postgres")) // pgx's defaults, as code under test would
	if err != nil {
		t.Fatal(err)
	}
	var n int
	if err := conn.QueryRow(ctx, "SELECT $1::int", 7).Scan(&n); err != nil {
		t.Fatal(err)
	}
	conn.Close(ctx)

	wantLeak(t, leaks(t, ctx, b, db), "prepared statements stmtcache_")
}

// ServerSessions reaches every server connection SHOW SERVERS lists, also
// while other clients keep the pool busy.
func TestServerSessionsVisitsEveryServer(t *testing.T) {
	b, db := setup(t, Options{PoolSize: 4})
	ctx := testCtx(t)

	// Three clients in open transactions at once force three server
	// connections.
	var txs []pgx.Tx
	for range 3 {
		tx, err := through(t, ctx, b, db).Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		txs = append(txs, tx)
	}
	for _, tx := range txs {
		if err := tx.Rollback(ctx); err != nil {
			t.Fatal(err)
		}
	}
	st, err := b.Admin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	before := st.ServersOf(db, "postgres")
	if len(before) != 3 {
		t.Fatalf("SHOW SERVERS after three concurrent transactions: %+v; want 3", before)
	}

	loadCtx, stopLoad := context.WithCancel(ctx)
	wait, done := b.Load(loadCtx, db, "postgres", 3)
	// Let the load commit something first, so it really shares the pool
	// with ServerSessions.
	testwait.Until(t, time.Minute, "the load to commit 10 transactions", func() bool { return done.Load() >= 10 })
	sessions, err := b.ServerSessions(ctx, db, "postgres")
	if err != nil {
		t.Fatal(err)
	}
	stopLoad()
	if err := wait(); err != nil {
		t.Fatalf("load: %v", err)
	}

	var visited []int
	for _, s := range sessions {
		visited = append(visited, s.PID)
	}
	for _, s := range before {
		if !slices.Contains(visited, s.RemotePID) {
			t.Errorf("backend %d from SHOW SERVERS not visited (visited %v)", s.RemotePID, visited)
		}
	}
	st, err = b.Admin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range st.ServersOf(db, "postgres") {
		// The load's clients give up on their last query when stopped:
		// pgbouncer delivers the cancel on a connection of its own.
		if s.HasSession() && !slices.Contains(visited, s.RemotePID) {
			t.Errorf("backend %d in SHOW SERVERS now was never visited (visited %v): %+v", s.RemotePID, visited, s)
		}
	}
	if len(visited) != b.PoolSize {
		t.Errorf("visited %d backends %v; want the whole pool of %d", len(visited), visited, b.PoolSize)
	}
	// The load's upserts leave nothing behind either.
	if l := leaks(t, ctx, b, db); len(l) != 0 {
		t.Errorf("leaks after the load: %q", l)
	}
	if done.Load() == 0 {
		t.Fatal("load committed nothing")
	}
}

// In session mode pgbouncer runs server_reset_query (DISCARD ALL) when a
// client leaves, so what leaks in transaction mode does not here.
func TestSessionModeResetsState(t *testing.T) {
	b, db := setup(t, Options{Mode: "session", PoolSize: 2})
	ctx := testCtx(t)
	conn := through(t, ctx, b, db)
	pid := backendPID(t, ctx, conn)
	execSQL(t, ctx, conn, "SELECT set_config('wal_compression', 'pglz', false)")
	execSQL(t, ctx, conn, "LISTEN pgbouncertest_foo")
	execSQL(t, ctx, conn, "SELECT pg_try_advisory_lock(4242)")
	execSQL(t, ctx, conn, "PREPARE pgbouncertest_stmt AS SELECT 1")
	conn.Close(ctx)

	sessions, err := b.ServerSessions(ctx, db, "postgres")
	if err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(sessions, func(s ServerSession) bool { return s.PID == pid }) {
		t.Fatalf("the client's backend %d was not visited: %+v", pid, sessions)
	}
	if l := leaks(t, ctx, b, db); len(l) != 0 {
		t.Fatalf("leaks in session mode after DISCARD ALL: %q", l)
	}
}

// The database can be dropped while pgbouncer still holds server connections
// to it: dbtest drops WITH (FORCE), which ends them, so a test that starts
// pgbouncer before creating its database does not hang in cleanup either.
func TestDropWhilePgBouncerHoldsServerConnections(t *testing.T) {
	b := Start(t, Options{})
	ctx := testCtx(t)
	var db string
	t.Run("reversed cleanup order", func(t *testing.T) {
		db = DatabaseName(t, dbtest.NewDatabase(t)) // dropped when this subtest ends
		backendPID(t, ctx, through(t, ctx, b, db))
		st, err := b.Admin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if len(st.ServersOf(db, "postgres")) == 0 {
			t.Fatal("pgbouncer holds no server connection to the database")
		}
	})
	direct, err := pgx.Connect(ctx, b.DirectURL("postgres", "postgres"))
	if err != nil {
		t.Fatal(err)
	}
	defer direct.Close(ctx)
	var exists bool
	if err := direct.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)", db).Scan(&exists); err != nil {
		t.Fatal(err)
	}
	if exists {
		t.Fatalf("database %s still exists after its test's cleanup", db)
	}
	if _, err := b.Admin(ctx); err != nil {
		t.Fatalf("pgbouncer after the drop: %v", err)
	}
}

// pgbouncer 1.18 refuses a startup parameter it neither tracks nor is told
// to ignore (ignore_startup_parameters). pgx sends none by default, and
// application_name (the one idemd's daemons send) is tracked, so the harness
// ignores none; a URL that sets, say, statement_timeout at connect time is
// refused, as it would be in production behind the same pgbouncer.
func TestStartupParameters(t *testing.T) {
	b, db := setup(t, Options{})
	ctx := testCtx(t)
	conn, err := pgx.Connect(ctx, b.URL(db, "postgres")+"&application_name=idemd-test")
	if err != nil {
		t.Fatalf("application_name at connect time: %v", err)
	}
	conn.Close(ctx)

	cfg, err := pgx.ParseConfig(b.URL(db, "postgres"))
	if err != nil {
		t.Fatal(err)
	}
	cfg.RuntimeParams["statement_timeout"] = "5s"
	conn, err = pgx.ConnectConfig(ctx, cfg)
	if err == nil {
		conn.Close(ctx)
		t.Fatal("pgbouncer accepted statement_timeout as a startup parameter; the harness's docs say it refuses it")
	}
	if !strings.Contains(err.Error(), "unsupported startup parameter") {
		t.Fatalf("statement_timeout at connect time: %v; want pgbouncer's unsupported startup parameter", err)
	}
}
