// Package tcpproxy is a TCP proxy the end-to-end suite puts between the
// daemons and PostgreSQL, so a test can inject the network's faults: the
// ones that announce themselves (every connection cut at once, as a
// failover would) and the silent ones, which cloud networks produce most
// often:
//
//   - latency: every chunk reaches the other side a fixed delay after it
//     arrived, in order (a long link, not a narrow one);
//   - a black hole: a NAT or load balancer that lost its flow table. Open
//     connections stop forwarding a single byte, in either direction, and
//     nothing is closed; new connections are accepted (the proxy's kernel
//     completes the handshake) and held: nothing is forwarded, no server
//     connection is dialed. Optionally the server's side of each silenced
//     connection is closed after a delay, as the server's own keepalives
//     would end a session whose client no longer answers;
//   - half-open connections: the server's side of chosen connections is
//     closed and their client's side left open and silent, so no FIN or
//     RST ever reaches the client (the server's host died, or its session
//     was ended, while the network between them lost the news).
//
// A silenced connection never forwards again, not even after Heal: a NAT
// that lost a flow drops that flow's packets for good (a packet in the
// middle of a stream creates no new mapping), and so does the proxy. Heal
// ends the hole for connections accepted from then on; the ones accepted
// during the hole stay held and silent too, because their client has
// already sent its first bytes into the hole, and a client that waits
// forever on such a connection is what the fault is to find. Whatever a
// silenced connection's client sends is read and dropped, so its sends
// never block, as a network's would not; when the client closes its side,
// the proxy closes that socket and tells nobody.
//
// The proxy's kernel answers TCP keepalives and acknowledges data on both
// of its sockets, so neither the client's TCP keepalives nor its
// TCP_USER_TIMEOUT can tell a silenced connection from a live idle one:
// only a deadline of the client's own (or a reply that never comes to a
// probe it sends) can. That makes the black hole harder on the client than
// a real network's, never easier.
package tcpproxy

import (
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// Proxy forwards every connection accepted on Addr to a target.
type Proxy struct {
	target  string
	ln      net.Listener
	latency atomic.Int64 // nanoseconds each chunk waits before it is forwarded

	mu     sync.Mutex
	links  map[*link]struct{}
	hole   *hole // the black hole in force, nil when there is none
	holes  []*hole
	closed bool
	wg     sync.WaitGroup

	accepted, severed, silenced, held, halfOpened, serverClosed atomic.Int64
	dropped                                                     atomic.Int64
}

// link is one client connection and, once dialed, its server connection.
type link struct {
	client net.Conn
	server net.Conn // nil until dialed, and for ever for a held connection
	// silent: nothing is forwarded any more, in either direction, and no
	// close of either side is passed on. Never unset.
	silent atomic.Bool
	// hole is the black hole that silenced the link, if one did; its
	// timer (or EndServerSessions) closes the server side.
	hole *hole
	// serverEnded: a hole's timer or EndServerSessions closed the server
	// side (under Proxy.mu), counted once in ServerClosed.
	serverEnded bool
}

// hole is one black hole.
type hole struct {
	closeServerAfter time.Duration
	timer            *time.Timer
	fired            bool // the timer closed the server sides (under Proxy.mu)
}

// Conn describes one forwarding connection, for choosing the ones to
// half-open.
type Conn struct {
	// Client is the client's address: its end of the connection to the
	// proxy (the daemon's local address).
	Client net.Addr
	// Server is the proxy's own end of its connection to the target: the
	// address the target sees as its client (PostgreSQL's
	// pg_stat_activity.client_addr and client_port).
	Server net.Addr
}

// HoleOptions configure a black hole.
type HoleOptions struct {
	// CloseServerAfter, when positive, closes the server's side of every
	// connection the hole silenced this long after the hole began, as the
	// server's keepalives would end a session whose client stopped
	// answering; the client's side stays open and silent. Zero leaves the
	// server's sides open until Sever or Close.
	CloseServerAfter time.Duration
}

// Stats counts what the proxy did since it started.
type Stats struct {
	Accepted int64 // client connections accepted
	Severed  int64 // sockets (client and server sides) closed by Sever
	// Silenced: forwarding connections a black hole silenced; Held:
	// connections accepted during a hole, never forwarded; HalfOpened:
	// connections HalfOpen silenced; ServerClosed: server sides a hole's
	// CloseServerAfter or EndServerSessions closed.
	Silenced, Held, HalfOpened, ServerClosed int64
	// Dropped is the bytes read from silenced and held connections and
	// forwarded nowhere.
	Dropped int64
}

// New listens on 127.0.0.1 (a free port) and forwards to target.
func New(target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("tcpproxy: listen: %w", err)
	}
	p := &Proxy{target: target, ln: ln, links: map[*link]struct{}{}}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Addr is host:port of the proxy.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Port is the proxy's port.
func (p *Proxy) Port() int { return p.ln.Addr().(*net.TCPAddr).Port }

// SetLatency makes every chunk, in either direction, wait d after the
// proxy read it before it is forwarded (zero turns it off). Chunks keep
// their order and a chunk does not wait for the ones before it to have
// waited: a link d long, not a slower one. Connections stay open.
func (p *Proxy) SetLatency(d time.Duration) { p.latency.Store(int64(d)) }

// Sever closes every open socket, client and server side (held and
// silenced ones included), and returns how many it closed. New connections
// are accepted as before.
func (p *Proxy) Sever() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for l := range p.links {
		l.client.Close()
		n++
		if l.server != nil {
			l.server.Close()
			n++
		}
	}
	p.severed.Add(int64(n))
	return n
}

// BlackHole silences every open connection and holds every new one until
// Heal (see the package comment), and returns how many open connections it
// silenced.
func (p *Proxy) BlackHole(o HoleOptions) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	h := &hole{closeServerAfter: o.CloseServerAfter}
	p.hole = h
	p.holes = append(p.holes, h)
	n := 0
	for l := range p.links {
		if l.server != nil && l.silent.CompareAndSwap(false, true) {
			l.hole = h
			n++
		}
	}
	p.silenced.Add(int64(n))
	if h.closeServerAfter > 0 {
		h.timer = time.AfterFunc(h.closeServerAfter, func() { p.closeServers(h) })
	}
	return n
}

// Heal ends the black hole: connections accepted from now on are
// forwarded. The ones it silenced or held stay silent.
func (p *Proxy) Heal() {
	p.mu.Lock()
	p.hole = nil
	p.mu.Unlock()
}

// closeServers closes the server's side of every connection h silenced.
func (p *Proxy) closeServers(h *hole) {
	p.mu.Lock()
	defer p.mu.Unlock()
	h.fired = true
	for l := range p.links {
		if l.hole == h {
			p.endServer(l)
		}
	}
}

// EndServerSessions closes, now, the server's side of every connection a
// black hole silenced, as a hole's CloseServerAfter does when its delay is
// up: the server's keepalives have ended the sessions of a client that
// stopped answering, releasing what they held (locks, LISTEN). Their
// clients' sides stay open and silent. It returns how many it closed.
func (p *Proxy) EndServerSessions() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for l := range p.links {
		if l.hole != nil && p.endServer(l) {
			n++
		}
	}
	return n
}

// endServer closes l's server side once (under p.mu) and reports whether
// it did.
func (p *Proxy) endServer(l *link) bool {
	if l.server == nil || l.serverEnded {
		return false
	}
	l.serverEnded = true
	l.server.Close()
	p.serverClosed.Add(1)
	return true
}

// Conns lists the connections that forward: dialed, not silenced.
func (p *Proxy) Conns() []Conn {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []Conn
	for l := range p.links {
		if l.server != nil && !l.silent.Load() {
			out = append(out, Conn{Client: l.client.RemoteAddr(), Server: l.server.LocalAddr()})
		}
	}
	return out
}

// HalfOpen closes the server's side of every forwarding connection match
// chooses and leaves its client's side open and silent, and returns how
// many it chose.
func (p *Proxy) HalfOpen(match func(Conn) bool) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for l := range p.links {
		if l.server == nil || l.silent.Load() {
			continue
		}
		if match(Conn{Client: l.client.RemoteAddr(), Server: l.server.LocalAddr()}) && l.silent.CompareAndSwap(false, true) {
			l.server.Close()
			n++
		}
	}
	p.halfOpened.Add(int64(n))
	return n
}

// Stats returns the counts so far.
func (p *Proxy) Stats() Stats {
	return Stats{
		Accepted: p.accepted.Load(), Severed: p.severed.Load(),
		Silenced: p.silenced.Load(), Held: p.held.Load(), HalfOpened: p.halfOpened.Load(),
		ServerClosed: p.serverClosed.Load(), Dropped: p.dropped.Load(),
	}
}

// Close stops accepting, closes every connection and waits for the
// forwarding goroutines.
func (p *Proxy) Close() error {
	p.mu.Lock()
	p.closed = true
	for _, h := range p.holes {
		if h.timer != nil {
			h.timer.Stop()
		}
	}
	for l := range p.links {
		l.client.Close()
		if l.server != nil {
			l.server.Close()
		}
	}
	p.mu.Unlock()
	err := p.ln.Close()
	p.wg.Wait()
	return err
}

// add tracks a new client connection; during a black hole it is held
// (silent from the start). False once the proxy is closed.
func (p *Proxy) add(l *link) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return false
	}
	if p.hole != nil {
		l.silent.Store(true)
		p.held.Add(1)
	}
	p.links[l] = struct{}{}
	return true
}

// attach records a link's server connection. A hole that began while it
// was dialed silences it at once. False once the proxy is closed.
func (p *Proxy) attach(l *link, server net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return false
	}
	l.server = server
	if p.hole != nil && l.silent.CompareAndSwap(false, true) {
		l.hole = p.hole
		p.silenced.Add(1)
		if p.hole.fired {
			// Dialed across the hole's CloseServerAfter: its server side
			// goes at once, as the others' went.
			p.endServer(l)
		}
	}
	return true
}

func (p *Proxy) remove(l *link) {
	p.mu.Lock()
	delete(p.links, l)
	p.mu.Unlock()
	l.client.Close()
	if l.server != nil {
		l.server.Close()
	}
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		client, err := p.ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		p.accepted.Add(1)
		p.wg.Add(1)
		go p.serve(client)
	}
}

func (p *Proxy) serve(client net.Conn) {
	defer p.wg.Done()
	l := &link{client: client}
	if !p.add(l) {
		client.Close()
		return
	}
	defer p.remove(l)
	if l.silent.Load() {
		// Held: read and drop until the client gives up.
		p.drop(client)
		return
	}
	server, err := net.DialTimeout("tcp", p.target, 5*time.Second)
	if err != nil {
		// The target is down (PostgreSQL restarting): the client sees a
		// closed connection, as it would from a real network path.
		return
	}
	if !p.attach(l, server) {
		server.Close()
		return
	}
	done := make(chan struct{}, 2)
	go func() { p.pipe(l, server, client); done <- struct{}{} }()
	go func() { p.pipe(l, client, server); done <- struct{}{} }()
	// When either direction ends, close both so the other ends too; a
	// silenced link passes on no close: each direction ends when its own
	// source does (the client giving up, the hole's timer, Sever, Close).
	<-done
	if !l.silent.Load() {
		client.Close()
		server.Close()
	}
	<-done
}

// drop reads src until it ends and forwards nothing.
func (p *Proxy) drop(src net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		p.dropped.Add(int64(n))
		if err != nil {
			return
		}
	}
}

// chunk is what one read returned, and when it is to be forwarded.
type chunk struct {
	b   []byte
	due time.Time
}

// pipe forwards src to dst through a delay line: the reader stamps each
// chunk with its due time (now + latency, never before the previous
// chunk's), the writer forwards it then. Once l is silent, chunks are
// dropped instead, and a failed write no longer closes anything.
func (p *Proxy) pipe(l *link, dst, src net.Conn) {
	line := make(chan chunk, 64)
	wrote := make(chan struct{})
	go func() {
		defer close(wrote)
		failed := false
		for c := range line {
			if d := time.Until(c.due); d > 0 {
				time.Sleep(d) // the injected latency itself, not a wait for work
			}
			if failed || l.silent.Load() {
				p.dropped.Add(int64(len(c.b)))
				continue
			}
			if _, err := dst.Write(c.b); err != nil {
				// The other side is gone: end the link (unless it is
				// silent, which passes on no close), and drop the rest.
				failed = true
				if !l.silent.Load() {
					l.client.Close()
					l.server.Close()
				}
			}
		}
	}()
	var last time.Time
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			due := time.Now().Add(time.Duration(p.latency.Load()))
			if due.Before(last) {
				due = last
			}
			last = due
			line <- chunk{b: append([]byte(nil), buf[:n]...), due: due}
		}
		if err != nil {
			// EOF or a closed socket: this direction is over.
			break
		}
	}
	close(line)
	<-wrote
}
