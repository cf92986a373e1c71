package tcpproxy

import (
	"bufio"
	"net"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// echo serves one line back per line received.
func echo(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	t.Cleanup(func() { ln.Close(); <-done })
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				r := bufio.NewReader(c)
				for {
					line, err := r.ReadString('\n')
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
	return ln.Addr().String()
}

func roundTrip(c net.Conn, r *bufio.Reader) (string, error) {
	if _, err := c.Write([]byte("ping\n")); err != nil {
		return "", err
	}
	return r.ReadString('\n')
}

func TestForwardSeverDelay(t *testing.T) {
	p, err := New(echo(t))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()

	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	r := bufio.NewReader(c)
	if got, err := roundTrip(c, r); err != nil || got != "ping\n" {
		t.Fatalf("round trip through proxy: %q, %v", got, err)
	}

	if n := p.Sever(); n != 2 {
		t.Fatalf("Sever closed %d sockets, want 2 (client and server side)", n)
	}
	if err := c.SetDeadline(time.Now().Add(10 * time.Second)); err != nil {
		t.Fatal(err)
	}
	if _, err := roundTrip(c, r); err == nil {
		t.Fatal("a severed connection still works")
	}

	// New connections work after a sever, and a delay slows them down
	// without breaking them.
	p.SetDelay(20 * time.Millisecond)
	c2, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	start := time.Now()
	if got, err := roundTrip(c2, bufio.NewReader(c2)); err != nil || got != "ping\n" {
		t.Fatalf("round trip after sever: %q, %v", got, err)
	}
	if time.Since(start) < 40*time.Millisecond {
		t.Fatalf("delay not applied: round trip took %s", time.Since(start))
	}
	if acc, sev := p.Stats(); acc != 2 || sev != 2 {
		t.Fatalf("stats: accepted %d severed %d", acc, sev)
	}
}
