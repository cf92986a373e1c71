// Package tcpproxy is a TCP proxy the end-to-end suite puts between the
// daemons and PostgreSQL, so a test can cut every connection at once (as a
// network partition or a load balancer failover would) and add latency.
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
	target string
	ln     net.Listener
	delay  atomic.Int64 // nanoseconds added before each forwarded chunk

	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	closed bool
	wg     sync.WaitGroup

	accepted atomic.Int64
	severed  atomic.Int64
}

// New listens on 127.0.0.1 (a free port) and forwards to target.
func New(target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("tcpproxy: listen: %w", err)
	}
	p := &Proxy{target: target, ln: ln, conns: map[net.Conn]struct{}{}}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Addr is host:port of the proxy.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Port is the proxy's port.
func (p *Proxy) Port() int { return p.ln.Addr().(*net.TCPAddr).Port }

// SetDelay adds d before every chunk forwarded in either direction (zero
// turns it off). Connections stay open: this is a slow network, not a cut.
func (p *Proxy) SetDelay(d time.Duration) { p.delay.Store(int64(d)) }

// Sever closes every open socket, client and server side, and returns how
// many it closed. New connections are accepted as before.
func (p *Proxy) Sever() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for c := range p.conns {
		c.Close()
		n++
	}
	p.severed.Add(int64(n))
	return n
}

// Stats returns client connections accepted and sockets (client and server
// sides) severed so far.
func (p *Proxy) Stats() (accepted, severed int64) { return p.accepted.Load(), p.severed.Load() }

// Close stops accepting, closes every connection and waits for the
// forwarding goroutines.
func (p *Proxy) Close() error {
	p.mu.Lock()
	p.closed = true
	for c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
	err := p.ln.Close()
	p.wg.Wait()
	return err
}

func (p *Proxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *Proxy) untrack(c net.Conn) {
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
	c.Close()
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
	if !p.track(client) {
		client.Close()
		return
	}
	defer p.untrack(client)
	server, err := net.DialTimeout("tcp", p.target, 5*time.Second)
	if err != nil {
		// The target is down (PostgreSQL restarting): the client sees a
		// closed connection, as it would from a real network path.
		return
	}
	if !p.track(server) {
		server.Close()
		return
	}
	defer p.untrack(server)
	done := make(chan struct{}, 2)
	go func() { p.pipe(server, client); done <- struct{}{} }()
	go func() { p.pipe(client, server); done <- struct{}{} }()
	// When either direction ends, close both so the other ends too.
	<-done
	client.Close()
	server.Close()
	<-done
}

func (p *Proxy) pipe(dst, src net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if d := time.Duration(p.delay.Load()); d > 0 {
				time.Sleep(d) // the injected latency itself, not a wait for work
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			// EOF or a severed socket: either way this direction is over.
			return
		}
	}
}
