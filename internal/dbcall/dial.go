package dbcall

import (
	"context"
	"net"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// The client side of every connection idemd dials. Keepalives find a peer
// that vanished while the connection idles (a node that died, a NAT that
// dropped the flow): the kernel probes after KeepAliveIdle of silence and
// gives up after KeepAliveCount unanswered probes KeepAliveInterval apart.
// UserTimeout (TCP_USER_TIMEOUT) does the same for data that was sent and
// never acknowledged, inside a blocking read or write, which keepalives do
// not cover; it is set to the keepalives' own limit so the two agree.
// Neither can see a peer whose kernel still acknowledges (a userspace
// proxy that stopped forwarding, a frozen server process): only the
// deadline each call carries (Bounds) ends those.
const (
	KeepAliveIdle     = 10 * time.Second
	KeepAliveInterval = 5 * time.Second
	KeepAliveCount    = 3
	UserTimeout       = KeepAliveIdle + KeepAliveCount*KeepAliveInterval
)

// dialer dials with the keepalives and TCP_USER_TIMEOUT above; the
// connection's own context (connect_timeout, the call's deadline) bounds
// the dial.
var dialer = &net.Dialer{
	KeepAliveConfig: net.KeepAliveConfig{
		Enable:   true,
		Idle:     KeepAliveIdle,
		Interval: KeepAliveInterval,
		Count:    KeepAliveCount,
	},
	Control: setUserTimeout,
}

// Dial is the pgx DialFunc of every connection idemd opens.
func Dial(ctx context.Context, network, addr string) (net.Conn, error) {
	return dialer.DialContext(ctx, network, addr)
}

// Connections makes every connection opened with cc end in bounded time
// whatever the network does: it dials with Dial, and a connection attempt
// is given connectTimeout unless the URL set connect_timeout (or
// PGCONNECT_TIMEOUT); connect_timeout=0, libpq's "wait forever", is
// given it too. pgx reads DialFunc and ConnectTimeout from cc for the
// fallback hosts of a multi-host URL as well.
func Connections(cc *pgconn.Config, connectTimeout time.Duration) {
	cc.DialFunc = Dial
	if cc.ConnectTimeout <= 0 {
		cc.ConnectTimeout = connectTimeout
	}
}

// ServerKeepalives are the server's side of a session that holds
// something across statements (the enqueuer's drainer and polling locks,
// LISTEN), which sets them itself: the
// server probes a client that went silent after ServerKeepalives' idle
// time and ends the session once its probes go unanswered (about 25 s),
// and while a statement runs it checks every 5 s that the client is still
// there (client_connection_check_interval, PostgreSQL 14), so what the
// session held is released instead of outliving a client that vanished
// without closing its socket.
var ServerKeepalives = []Setting{
	{"tcp_keepalives_idle", strconv.Itoa(int(KeepAliveIdle.Seconds()))},
	{"tcp_keepalives_interval", strconv.Itoa(int(KeepAliveInterval.Seconds()))},
	{"tcp_keepalives_count", strconv.Itoa(KeepAliveCount)},
	{"client_connection_check_interval", "5s"},
}

// Setting is one server setting.
type Setting struct{ Name, Value string }
