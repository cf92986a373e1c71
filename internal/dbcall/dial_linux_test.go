package dbcall

import (
	"context"
	"net"
	"testing"

	"golang.org/x/sys/unix"
)

// Every socket Dial opens carries the keepalives and TCP_USER_TIMEOUT,
// read back from the kernel.
func TestDialSetsKeepalivesAndUserTimeout(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		if c, err := ln.Accept(); err == nil {
			defer c.Close()
			c.Read(make([]byte, 1)) //nolint:errcheck // until the client closes
		}
	}()
	c, err := Dial(context.Background(), "tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	raw, err := c.(*net.TCPConn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	want := []struct {
		name       string
		level, opt int
		value      int
	}{
		{"SO_KEEPALIVE", unix.SOL_SOCKET, unix.SO_KEEPALIVE, 1},
		{"TCP_KEEPIDLE", unix.IPPROTO_TCP, unix.TCP_KEEPIDLE, int(KeepAliveIdle.Seconds())},
		{"TCP_KEEPINTVL", unix.IPPROTO_TCP, unix.TCP_KEEPINTVL, int(KeepAliveInterval.Seconds())},
		{"TCP_KEEPCNT", unix.IPPROTO_TCP, unix.TCP_KEEPCNT, KeepAliveCount},
		{"TCP_USER_TIMEOUT", unix.IPPROTO_TCP, unix.TCP_USER_TIMEOUT, int(UserTimeout.Milliseconds())},
	}
	for _, w := range want {
		var got int
		var gerr error
		if err := raw.Control(func(fd uintptr) { got, gerr = unix.GetsockoptInt(int(fd), w.level, w.opt) }); err != nil {
			t.Fatal(err)
		}
		if gerr != nil {
			t.Fatalf("getsockopt %s: %v", w.name, gerr)
		}
		if got != w.value {
			t.Errorf("%s = %d, want %d", w.name, got, w.value)
		}
	}
}
