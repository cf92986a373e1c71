package tcpproxy

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/idemd/idemd/internal/testing/testwait"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// echoServer serves one line back per line received and records what it
// saw of each connection, so a test can tell what the proxy forwarded.
type echoServer struct {
	addr string

	mu       sync.Mutex
	accepted int
	received int // bytes
	ended    map[string]bool
}

func echo(t *testing.T) *echoServer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &echoServer{addr: ln.Addr().String(), ended: map[string]bool{}}
	done := make(chan struct{})
	var conns sync.WaitGroup
	t.Cleanup(func() { ln.Close(); <-done; conns.Wait() })
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s.mu.Lock()
			s.accepted++
			s.mu.Unlock()
			conns.Add(1)
			go func() {
				defer conns.Done()
				defer c.Close()
				r := bufio.NewReader(c)
				for {
					line, err := r.ReadString('\n')
					s.mu.Lock()
					s.received += len(line)
					if err != nil {
						s.ended[c.RemoteAddr().String()] = true
					}
					s.mu.Unlock()
					if err != nil {
						return
					}
					if _, err := c.Write([]byte(line)); err != nil {
						return
					}
				}
			}()
		}
	}()
	return s
}

func (s *echoServer) counts() (accepted, received int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.accepted, s.received
}

// endedConn reports whether the server saw the connection from addr end.
func (s *echoServer) endedConn(addr net.Addr) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.ended[addr.String()]
}

func roundTrip(c net.Conn, r *bufio.Reader) (string, error) {
	if _, err := c.Write([]byte("ping\n")); err != nil {
		return "", err
	}
	return r.ReadString('\n')
}

// client is one connection through the proxy.
type client struct {
	net.Conn
	r *bufio.Reader
}

func dial(t *testing.T, p *Proxy) *client {
	t.Helper()
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return &client{Conn: c, r: bufio.NewReader(c)}
}

func (c *client) ping(t *testing.T) {
	t.Helper()
	if err := c.SetDeadline(time.Now().Add(10 * time.Second)); err != nil {
		t.Fatal(err)
	}
	if got, err := roundTrip(c, c.r); err != nil || got != "ping\n" {
		t.Fatalf("round trip through the proxy: %q, %v", got, err)
	}
}

// silent checks that c is neither answered nor closed: a read sees no byte,
// no EOF and no reset until its deadline. A proxy that closed or answered
// within the window fails it; one that would close later is what the other
// checks of the test (the server's view, the proxy's counts) exclude.
func (c *client) silent(t *testing.T) {
	t.Helper()
	if err := c.SetReadDeadline(time.Now().Add(300 * time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	b, err := c.r.ReadByte()
	if err == nil {
		t.Fatalf("a silent connection delivered %q", b)
	}
	if !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("a silent connection was closed or reset: %v", err)
	}
}

// send writes a line and waits until the proxy has read and dropped it.
func (c *client) sendDropped(t *testing.T, p *Proxy) {
	t.Helper()
	before := p.Stats().Dropped
	if err := c.SetWriteDeadline(time.Now().Add(10 * time.Second)); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Write([]byte("ping\n")); err != nil {
		t.Fatalf("write to a silent connection: %v", err)
	}
	testwait.Until(t, 10*time.Second, "the proxy to drop the line", func() bool { return p.Stats().Dropped >= before+5 })
}

func newProxy(t *testing.T, target string) *Proxy {
	t.Helper()
	p, err := New(target)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

func TestForwardSever(t *testing.T) {
	srv := echo(t)
	p := newProxy(t, srv.addr)
	c := dial(t, p)
	c.ping(t)

	if n := p.Sever(); n != 2 {
		t.Fatalf("Sever closed %d sockets, want 2 (client and server side)", n)
	}
	if err := c.SetDeadline(time.Now().Add(10 * time.Second)); err != nil {
		t.Fatal(err)
	}
	if _, err := roundTrip(c, c.r); err == nil {
		t.Fatal("a severed connection still works")
	}
	// New connections work after a sever.
	dial(t, p).ping(t)
	if st := p.Stats(); st.Accepted != 2 || st.Severed != 2 {
		t.Fatalf("stats: %+v", st)
	}
}

// TestLatency: a round trip takes at least the latency each way, and
// chunks keep their order.
func TestLatency(t *testing.T) {
	srv := echo(t)
	p := newProxy(t, srv.addr)
	const d = 20 * time.Millisecond
	p.SetLatency(d)
	c := dial(t, p)
	if err := c.SetDeadline(time.Now().Add(10 * time.Second)); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if got, err := roundTrip(c, c.r); err != nil || got != "ping\n" {
		t.Fatalf("round trip: %q, %v", got, err)
	}
	if took := time.Since(start); took < 2*d {
		t.Fatalf("a round trip took %s, less than the latency both ways (%s)", took, 2*d)
	}
	// Lines written one by one, each its own chunk, come back in order.
	const lines = 20
	go func() {
		for i := range lines {
			if _, err := fmt.Fprintf(c, "line %d\n", i); err != nil {
				return
			}
		}
	}()
	for i := range lines {
		got, err := c.r.ReadString('\n')
		if want := fmt.Sprintf("line %d\n", i); err != nil || got != want {
			t.Fatalf("line %d: got %q, %v (want %q)", i, got, err, want)
		}
	}
	p.SetLatency(0)
	c.ping(t)
}

// TestBlackHole: open connections go silent both ways and stay open; new
// ones are accepted but never reach the server; after Heal only new
// connections work, the silenced and held ones stay silent.
func TestBlackHole(t *testing.T) {
	srv := echo(t)
	p := newProxy(t, srv.addr)
	open := dial(t, p)
	open.ping(t)

	if n := p.BlackHole(HoleOptions{}); n != 1 {
		t.Fatalf("BlackHole silenced %d connections, want 1", n)
	}
	_, receivedBefore := srv.counts()
	open.sendDropped(t, p)
	open.silent(t)

	held := dial(t, p)
	held.sendDropped(t, p)
	held.silent(t)
	if accepted, received := srv.counts(); accepted != 1 || received != receivedBefore {
		t.Fatalf("during the hole the server saw %d connections and %d bytes, want 1 and %d", accepted, received, receivedBefore)
	}
	if srv.endedConn(p.silencedServerAddr(t)) {
		t.Fatal("the hole closed the server's side without CloseServerAfter")
	}

	p.Heal()
	dial(t, p).ping(t)
	open.sendDropped(t, p)
	open.silent(t)
	held.sendDropped(t, p)
	held.silent(t)
	if st := p.Stats(); st.Accepted != 3 || st.Silenced != 1 || st.Held != 1 || st.ServerClosed != 0 {
		t.Fatalf("stats: %+v", st)
	}

	// The client giving up closes nothing on the server's side.
	open.Close()
	held.Close()
	dial(t, p).ping(t)
	if accepted, _ := srv.counts(); accepted != 3 {
		t.Fatalf("the server saw %d connections, want 3 (the held one never dialed)", accepted)
	}
}

// silencedServerAddr returns the proxy's server-side address of its one
// silenced connection.
func (p *Proxy) silencedServerAddr(t *testing.T) net.Addr {
	t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	for l := range p.links {
		if l.server != nil && l.silent.Load() {
			return l.server.LocalAddr()
		}
	}
	t.Fatal("no silenced connection")
	return nil
}

// TestBlackHoleClosesServerSide: with CloseServerAfter the server sees its
// side of each silenced connection end, the client sees nothing.
func TestBlackHoleClosesServerSide(t *testing.T) {
	srv := echo(t)
	p := newProxy(t, srv.addr)
	c := dial(t, p)
	c.ping(t)
	p.BlackHole(HoleOptions{CloseServerAfter: 50 * time.Millisecond})
	server := p.silencedServerAddr(t)
	testwait.Until(t, 10*time.Second, "the server's side to be closed", func() bool { return srv.endedConn(server) })
	c.silent(t)
	c.sendDropped(t, p)
	c.silent(t)
	p.Heal()
	dial(t, p).ping(t)
	if st := p.Stats(); st.ServerClosed != 1 {
		t.Fatalf("stats: %+v", st)
	}
}

// TestEndServerSessions: the server sees its side of each silenced
// connection end when the test says so, once however often it says so;
// the client sees nothing.
func TestEndServerSessions(t *testing.T) {
	srv := echo(t)
	p := newProxy(t, srv.addr)
	c := dial(t, p)
	c.ping(t)
	if n := p.EndServerSessions(); n != 0 {
		t.Fatalf("EndServerSessions closed %d server sides before any hole, want 0", n)
	}
	p.BlackHole(HoleOptions{})
	held := dial(t, p)
	held.sendDropped(t, p)
	server := p.silencedServerAddr(t)
	if n := p.EndServerSessions(); n != 1 {
		t.Fatalf("EndServerSessions closed %d server sides, want 1 (the held one has none)", n)
	}
	testwait.Until(t, 10*time.Second, "the server's side to be closed", func() bool { return srv.endedConn(server) })
	c.silent(t)
	c.sendDropped(t, p)
	c.silent(t)
	if n := p.EndServerSessions(); n != 0 {
		t.Fatalf("a second EndServerSessions closed %d server sides, want 0", n)
	}
	p.Heal()
	dial(t, p).ping(t)
	if st := p.Stats(); st.ServerClosed != 1 || st.Silenced != 1 || st.Held != 1 {
		t.Fatalf("stats: %+v", st)
	}
}

// TestHalfOpen: the chosen connection's server side is closed and its
// client hears nothing; the others go on.
func TestHalfOpen(t *testing.T) {
	srv := echo(t)
	p := newProxy(t, srv.addr)
	victim, other := dial(t, p), dial(t, p)
	victim.ping(t)
	other.ping(t)
	conns := p.Conns()
	if len(conns) != 2 {
		t.Fatalf("Conns: %v, want 2", conns)
	}
	var server net.Addr
	for _, c := range conns {
		if c.Client.String() == victim.LocalAddr().String() {
			server = c.Server
		}
	}
	if server == nil {
		t.Fatalf("Conns %v does not list the victim %s", conns, victim.LocalAddr())
	}
	n := p.HalfOpen(func(c Conn) bool { return c.Client.String() == victim.LocalAddr().String() })
	if n != 1 {
		t.Fatalf("HalfOpen chose %d connections, want 1", n)
	}
	testwait.Until(t, 10*time.Second, "the server's side to be closed", func() bool { return srv.endedConn(server) })
	victim.silent(t)
	victim.sendDropped(t, p)
	victim.silent(t)
	other.ping(t)
	if len(p.Conns()) != 1 {
		t.Fatalf("Conns after HalfOpen: %v, want the other one", p.Conns())
	}
	if st := p.Stats(); st.HalfOpened != 1 || st.Silenced != 0 {
		t.Fatalf("stats: %+v", st)
	}
	// Sever still closes the half-open connection's client side.
	p.Sever()
	if err := victim.SetReadDeadline(time.Now().Add(10 * time.Second)); err != nil {
		t.Fatal(err)
	}
	if _, err := victim.r.ReadByte(); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("a severed half-open connection is still open: %v", err)
	}
}
