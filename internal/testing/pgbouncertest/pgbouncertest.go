// Package pgbouncertest runs a real PgBouncer (Debian's pgbouncer binary)
// between a test and the PostgreSQL server internal/testing/dbtest uses, so a test
// can prove a guarantee holds behind a transaction-mode connection pooler:
// that nothing depends on two transactions of one client connection reaching
// the same backend, and that no session state (advisory locks, LISTEN,
// prepared statements, changed settings) is left on the pooled server
// connections for the next client to inherit.
//
// Each Start runs its own pgbouncer process on a free port with its own
// config in a temporary directory, and stops it when the test ends. The
// binary comes from scripts/ensure-pgbouncer.sh; without it the test is
// skipped, or fails under CI=true.
//
// Call dbtest.NewDatabase before Start: cleanups run last-registered first,
// so pgbouncer is stopped (and its server connections closed) before dbtest
// drops the database. The other order is safe too (dbtest drops WITH
// (FORCE), which terminates pgbouncer's server connections), only noisier in
// pgbouncer's log.
package pgbouncertest

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/idemd/idemd/internal/testing/dbtest"
	"github.com/idemd/idemd/internal/testing/pgbouncer"
)

// Options configure one pgbouncer.
type Options struct {
	// Mode is pgbouncer's pool_mode: "transaction" (the default) or
	// "session".
	Mode string
	// PoolSize is default_pool_size: server connections per database/user
	// pair. Default 4.
	PoolSize int
	// Users are roles besides postgres that clients may connect as. They
	// must exist on the server; pgbouncer only needs them in its auth_file.
	Users []string
	// BackendURL is an admin URL (database postgres) of the server to pool;
	// empty: the server internal/testing/dbtest uses. The fault suite pools its own
	// cluster.
	BackendURL string
}

// Bouncer is one running pgbouncer: its Process (Mode, PoolSize, Addr, Dir,
// URL, DirectURL, LogTail) and what the test adds around it.
//
// URL leaves pgx's default query exec mode, so a test sees what the code
// under test really does: behind transaction pooling (pgbouncer 1.18 has no
// prepared statement support) pgx's default statement cache prepares one
// statement per query on whichever server connection it happens to use,
// and code must choose its own default_query_exec_mode.
type Bouncer struct {
	*pgbouncer.Process

	tb testing.TB

	stopProc func() error

	// stopLoad ends every Load when the test ends, before pgbouncer is
	// stopped, so no load goroutine outlives the test (dbtest.Main checks
	// for leaked goroutines).
	stopCtx  context.Context
	stopLoad context.CancelFunc
	loads    sync.WaitGroup
}

// Binary returns the path of the pgbouncer binary, or "" when there is none.
// Debian installs it in /usr/sbin, which a non-root PATH may lack.
func Binary() string { return pgbouncer.Binary() }

// Start runs a pgbouncer in front of dbtest's server and stops it when the
// test ends. It returns once pgbouncer answers a real query through to the
// server. The process itself is internal/pgbouncer's Run, which code
// outside tests (the benchmark) uses directly.
func Start(tb testing.TB, opts Options) *Bouncer {
	tb.Helper()
	if Binary() == "" {
		if os.Getenv("CI") == "true" {
			tb.Fatalf("pgbouncertest: no pgbouncer binary on this machine (CI=true); scripts/ensure-pgbouncer.sh installs it")
		}
		tb.Skip("pgbouncertest: no pgbouncer binary on this machine; run scripts/ensure-pgbouncer.sh")
	}
	if opts.Mode != "" && opts.Mode != "transaction" && opts.Mode != "session" {
		tb.Fatalf("pgbouncertest: Options.Mode %q: want transaction or session", opts.Mode)
	}
	backend := opts.BackendURL
	if backend == "" {
		backend = dbtest.ServerURL(tb)
	}
	proc, stop, err := pgbouncer.Run(context.Background(), pgbouncer.Options{
		Mode:       opts.Mode,
		PoolSize:   opts.PoolSize,
		Users:      opts.Users,
		BackendURL: backend,
		Logf: func(format string, args ...any) {
			tb.Helper()
			tb.Logf(format, args...)
		},
	})
	if err != nil {
		tb.Fatalf("pgbouncertest: %v", err)
	}
	stopCtx, stopLoad := context.WithCancel(context.Background())
	b := &Bouncer{Process: proc, tb: tb, stopProc: stop, stopCtx: stopCtx, stopLoad: stopLoad}
	tb.Cleanup(b.stop)
	return b
}

// connect opens a connection in the simple protocol: the harness's own
// queries must leave no prepared statement on a server connection (that is
// one of the things it looks for), and the admin console speaks only the
// simple protocol.
func connect(ctx context.Context, connURL string) (*pgx.Conn, error) {
	cfg, err := pgx.ParseConfig(connURL)
	if err != nil {
		return nil, fmt.Errorf("parse %s: %w", connURL, err)
	}
	cfg.DefaultQueryExecMode = pgx.QueryExecModeSimpleProtocol
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("connect %s: %w", redact(connURL), err)
	}
	return conn, nil
}

func redact(connURL string) string {
	u, err := url.Parse(connURL)
	if err != nil {
		return "(unparsable URL)"
	}
	return u.Redacted()
}

// stop ends every Load, then stops pgbouncer (SIGTERM is an immediate
// shutdown in pgbouncer 1.18: it closes client and server connections
// without waiting for them) and waits for it. SIGKILL follows if it hangs.
// A pgbouncer that exited during the test fails it.
func (b *Bouncer) stop() {
	b.stopLoad()
	b.loads.Wait()
	if err := b.stopProc(); err != nil {
		b.tb.Errorf("pgbouncertest: %v", err)
	}
}

// DatabaseName is the database name of a URL such as dbtest.NewDatabase's.
func DatabaseName(tb testing.TB, connURL string) string {
	tb.Helper()
	u, err := url.Parse(connURL)
	if err != nil {
		tb.Fatalf("pgbouncertest: parse %s: %v", redact(connURL), err)
	}
	name := strings.TrimPrefix(u.Path, "/")
	if name == "" {
		tb.Fatalf("pgbouncertest: %s names no database", redact(connURL))
	}
	return name
}
