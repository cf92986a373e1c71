// Package blackhole is a test database reached through a TCP proxy
// (tcpproxy) a test can turn into a black hole, the fault a NAT or load
// balancer that lost its flow table produces: the proxy's BlackHole stops
// every open connection forwarding a single byte, in either direction,
// without closing it, and holds every new one; Heal lets new connections
// through again, a silenced one stays silent for good. The proxy's kernel
// acknowledges data and answers keepalives on both of its sockets, so only
// a deadline of the client's own ends a call on a silenced connection.
//
// The proxy is tcpproxy's (its package comment says what each fault does);
// this package builds what a service's silent-network test needs around
// it: the URL through it, a daemon's pool on it and the daemon's bounds.
package blackhole

import (
	"context"
	"net/url"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemd/idemd/internal/config"
	"github.com/idemd/idemd/internal/daemon"
	"github.com/idemd/idemd/internal/dbcall"
	"github.com/idemd/idemd/internal/testing/dbtest"
	"github.com/idemd/idemd/internal/testing/tcpproxy"
)

// Through is a proxy to the server of the connection URL dbURL, and dbURL
// with the proxy in its place; the test's cleanup closes the proxy.
func Through(tb testing.TB, dbURL string) (*tcpproxy.Proxy, string) {
	tb.Helper()
	u, err := url.Parse(dbURL)
	if err != nil {
		tb.Fatalf("blackhole: parse the URL: %v", err)
	}
	p, err := tcpproxy.New(u.Host)
	if err != nil {
		tb.Fatalf("blackhole: %v", err)
	}
	tb.Cleanup(func() { p.Close() })
	u.Host = p.Addr()
	return p, u.String()
}

// Pool is a pool on the database of dbURL through a new proxy, built as a
// daemon builds its own (daemon.NewPool, a direct connection) with
// --database-timeout bound; a new connection gets connect_timeout 5 s, so
// a small bound does not fail connections on a loaded machine. The proxy
// is closed before the pool: pgx's pool waits up to 15 s for the cancel
// request of a connection it abandoned, which a held connection never
// answers.
func Pool(tb testing.TB, dbURL string, bound time.Duration) (*tcpproxy.Proxy, *pgxpool.Pool) {
	tb.Helper()
	p, holeURL := Through(tb, dbURL)
	pool, _, err := daemon.NewPool(context.Background(), config.Database{
		DatabaseURL: WithParam(holeURL, "connect_timeout", "5"), Timeout: bound, Pooler: config.PoolerNone,
	}, "idemd-test", nil)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(pool.Close)
	tb.Cleanup(func() { p.Close() })
	return p, pool
}

// Database is a fresh test database reached directly (for a test's own
// writes and its oracle) and through a proxy (for the service under
// test): the daemon's pool on the proxy, and Calls of bound.
func Database(tb testing.TB, bound time.Duration) (direct, pool *pgxpool.Pool, hole *tcpproxy.Proxy, calls *dbcall.Bounds) {
	tb.Helper()
	direct = dbtest.NewPool(tb)
	hole, pool = Pool(tb, direct.Config().ConnString(), bound)
	return direct, pool, hole, Calls(pool, bound)
}

// Calls are the Bounds a daemon gives its services on pool (daemon.Setup):
// bound, and a call that runs out of it resets the pool.
func Calls(pool *pgxpool.Pool, bound time.Duration) *dbcall.Bounds {
	calls := dbcall.New(bound, nil)
	calls.ResetOnTimeout(pool.Reset)
	return calls
}

// WithParam is the connection URL dbURL with the parameter name set to
// value.
func WithParam(dbURL, name, value string) string {
	u, err := url.Parse(dbURL)
	if err != nil {
		return dbURL
	}
	q := u.Query()
	q.Set(name, value)
	u.RawQuery = q.Encode()
	return u.String()
}
