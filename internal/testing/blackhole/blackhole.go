// Package blackhole is a TCP proxy a test puts between a service and
// PostgreSQL to make the network go silent, the fault a NAT or load
// balancer that lost its flow table produces: Silence stops every open
// connection forwarding a single byte, in either direction, without
// closing it, and holds every new connection (accepted, never forwarded).
// Heal lets new connections through again; a silenced one stays silent
// for good, as a NAT drops a lost flow's packets for good, so a client
// must abandon it and connect again.
//
// The proxy's kernel acknowledges data and answers keepalives on both of
// its sockets, so a client's TCP keepalives and TCP_USER_TIMEOUT cannot
// tell a silenced connection from an idle one: only a deadline of the
// client's own ends a call on it.
package blackhole

import (
	"context"
	"io"
	"net"
	"net/url"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemd/idemd/internal/config"
	"github.com/idemd/idemd/internal/daemon"
	"github.com/idemd/idemd/internal/dbcall"
	"github.com/idemd/idemd/internal/testing/dbtest"
)

// Proxy forwards the connections accepted on Addr to a target until
// Silence.
type Proxy struct {
	target string
	ln     net.Listener

	closeOnce sync.Once

	mu     sync.Mutex
	silent bool
	links  map[*link]struct{}
	wg     sync.WaitGroup
}

// link is one client connection and, unless it was held, its server
// connection.
type link struct {
	client, server net.Conn // server nil for a held connection
	silent         atomic.Bool
}

// New listens on a free loopback port and forwards to target (host:port);
// the test's cleanup closes it.
func New(tb testing.TB, target string) *Proxy {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatalf("blackhole: listen: %v", err)
	}
	p := &Proxy{target: target, ln: ln, links: map[*link]struct{}{}}
	p.wg.Add(1)
	go p.accept()
	tb.Cleanup(p.Close)
	return p
}

// Through is New for the server of the connection URL dbURL, and dbURL
// with the proxy in its place.
func Through(tb testing.TB, dbURL string) (*Proxy, string) {
	tb.Helper()
	u, err := url.Parse(dbURL)
	if err != nil {
		tb.Fatalf("blackhole: parse the URL: %v", err)
	}
	p := New(tb, u.Host)
	u.Host = p.ln.Addr().String()
	return p, u.String()
}

// Pool is a pool on the database of dbURL through a new black hole, built
// as a daemon builds its own (daemon.NewPool, a direct connection) with
// --database-timeout bound; a new connection gets connect_timeout 5 s, so
// a small bound does not fail connections on a loaded machine. The
// proxy is closed before the pool (Close says why).
func Pool(tb testing.TB, dbURL string, bound time.Duration) (*Proxy, *pgxpool.Pool) {
	tb.Helper()
	p, holeURL := Through(tb, dbURL)
	pool, _, err := daemon.NewPool(context.Background(), config.Database{
		DatabaseURL: WithParam(holeURL, "connect_timeout", "5"), Timeout: bound, Pooler: config.PoolerNone,
	}, "idemd-test", nil)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(pool.Close)
	tb.Cleanup(p.Close)
	return p, pool
}

// Database is a fresh test database reached directly (for a test's own
// writes and its oracle) and through a black hole (for the service under
// test): the daemon's pool on the hole, and Calls of bound.
func Database(tb testing.TB, bound time.Duration) (direct, pool *pgxpool.Pool, hole *Proxy, calls *dbcall.Bounds) {
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

// Silence stops every open connection forwarding and holds the new ones
// until Heal.
func (p *Proxy) Silence() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.silent = true
	for l := range p.links {
		l.silent.Store(true)
	}
}

// Heal forwards the connections accepted from now on; the silenced ones
// stay silent.
func (p *Proxy) Heal() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.silent = false
}

// EndServerSessions closes the server's side of every silenced
// connection, as the server's keepalives end the sessions of a client
// that stopped answering, releasing what they held (locks, LISTEN); their
// clients' sides stay open and silent.
func (p *Proxy) EndServerSessions() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for l := range p.links {
		if l.silent.Load() && l.server != nil {
			l.server.Close()
		}
	}
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		l := &link{client: c}
		l.silent.Store(p.silent)
		p.links[l] = struct{}{}
		p.mu.Unlock()
		p.wg.Go(func() { p.serve(l) })
	}
}

// serve forwards l both ways until either side closes; a held connection
// is only read, and what it sends dropped.
func (p *Proxy) serve(l *link) {
	defer func() {
		p.mu.Lock()
		delete(p.links, l)
		p.mu.Unlock()
		l.client.Close()
		if l.server != nil {
			l.server.Close()
		}
	}()
	if l.silent.Load() {
		io.Copy(io.Discard, l.client) //nolint:errcheck // until the client closes
		return
	}
	s, err := net.Dial("tcp", p.target)
	if err != nil {
		return
	}
	p.mu.Lock()
	l.server = s
	p.mu.Unlock()
	fromClient, fromServer := make(chan struct{}), make(chan struct{})
	go func() { forward(l, s, l.client); close(fromClient) }()
	go func() { forward(l, l.client, s); close(fromServer) }()
	select {
	case <-fromClient:
	case <-fromServer:
		if l.silent.Load() {
			// The server ended its side of a silenced connection (its
			// keepalives gave up on the client): no FIN may reach the
			// client, whose side stays open until it closes it.
			<-fromClient
		}
	}
}

// forward copies src to dst until src ends, dropping what it reads once l
// is silent.
func forward(l *link, dst, src net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 && !l.silent.Load() {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// Close closes every connection and waits for the proxy's goroutines; the
// test's cleanup calls it too. A test closes it before a pool whose
// connections the hole silenced: pgx's pool waits up to 15 s for the
// cancel request of a connection it abandoned, which a held connection
// never answers.
func (p *Proxy) Close() {
	p.closeOnce.Do(p.close)
}

func (p *Proxy) close() {
	p.ln.Close()
	p.mu.Lock()
	for l := range p.links {
		l.client.Close()
		if l.server != nil {
			l.server.Close()
		}
	}
	p.mu.Unlock()
	p.wg.Wait()
}
