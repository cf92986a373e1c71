package pgbouncertest

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"

	"github.com/jackc/pgx/v5"
)

// Settings are the session settings ServerSessions and Defaults read: the
// ones idemd's daemons or their libraries set per session (the reaper's
// wal_compression and SET ROLE, timeouts, synchronous_commit), plus the
// usual suspects a pooled connection can carry to the next client.
var Settings = []string{
	"wal_compression",
	"client_connection_check_interval",
	"statement_timeout",
	"lock_timeout",
	"synchronous_commit",
	"idle_in_transaction_session_timeout",
	"application_name",
	"search_path",
	"role",
	"session_authorization",
}

// ServerSession is the session state of one backend: what the next client
// pgbouncer hands that server connection to would inherit.
type ServerSession struct {
	PID                int
	Settings           map[string]string // name → current_setting(name)
	Listening          []string          // pg_listening_channels()
	PreparedStatements []string          // pg_prepared_statements.name
	AdvisoryLocks      []string          // "classid:objid:objsubid mode" held by this pid
	TempTables         []string          // tables in this backend's temp schema
	HoldCursors        []string          // pg_cursors (WITH HOLD survives the transaction)
}

// sessionQuery reads a backend's state in one round trip. It runs inside
// the harness's own transaction, which takes no advisory lock, prepares
// nothing (simple protocol) and listens on nothing, so whatever it finds
// was left by an earlier client.
const sessionQuery = `
SELECT pg_backend_pid(),
       (SELECT coalesce(array_agg(n || '=' || current_setting(n) ORDER BY n), '{}') FROM unnest($1::text[]) AS n),
       (SELECT coalesce(array_agg(c ORDER BY c), '{}') FROM pg_listening_channels() AS c),
       (SELECT coalesce(array_agg(name ORDER BY name), '{}') FROM pg_prepared_statements),
       (SELECT coalesce(array_agg(l ORDER BY l), '{}')
          FROM (SELECT format('%s:%s:%s %s', classid, objid, objsubid, mode) AS l
                  FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()) AS a),
       (SELECT coalesce(array_agg(relname::text ORDER BY relname), '{}') FROM pg_class WHERE relnamespace = pg_my_temp_schema()),
       (SELECT coalesce(array_agg(name ORDER BY name), '{}') FROM pg_cursors)`

func readSession(ctx context.Context, tx pgx.Tx) (ServerSession, error) {
	var s ServerSession
	var settings []string
	err := tx.QueryRow(ctx, sessionQuery, Settings).Scan(&s.PID, &settings, &s.Listening, &s.PreparedStatements, &s.AdvisoryLocks, &s.TempTables, &s.HoldCursors)
	if err != nil {
		return ServerSession{}, fmt.Errorf("read session state: %w", err)
	}
	s.Settings = make(map[string]string, len(settings))
	for _, kv := range settings {
		k, v, _ := strings.Cut(kv, "=")
		s.Settings[k] = v
	}
	return s, nil
}

// Defaults reads the same state from a fresh connection straight to the
// server (directURL, not through pgbouncer): what a server connection for
// that database and user looks like when nobody has touched it. Database and
// role settings (ALTER DATABASE/ROLE ... SET) apply to both alike.
func Defaults(ctx context.Context, directURL string) (ServerSession, error) {
	conn, err := connect(ctx, directURL)
	if err != nil {
		return ServerSession{}, fmt.Errorf("defaults: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	tx, err := conn.Begin(ctx)
	if err != nil {
		return ServerSession{}, fmt.Errorf("defaults: begin: %w", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // read-only
	s, err := readSession(ctx, tx)
	if err != nil {
		return ServerSession{}, fmt.Errorf("defaults: %w", err)
	}
	return s, nil
}

// Diff lists every way s differs from defaults (from Defaults): a changed
// setting, a LISTEN, a prepared statement, an advisory lock, a temp table, a
// held cursor. Empty means the next client gets a clean session. Settings
// named in ignore are not compared (see Leaks for why application_name may
// need to be).
func (s ServerSession) Diff(defaults ServerSession, ignore ...string) []string {
	var out []string
	names := make([]string, 0, len(s.Settings))
	for n := range s.Settings {
		if !slices.Contains(ignore, n) {
			names = append(names, n)
		}
	}
	sort.Strings(names)
	for _, n := range names {
		if v, d := s.Settings[n], defaults.Settings[n]; v != d {
			out = append(out, fmt.Sprintf("backend %d: %s = %q (default %q)", s.PID, n, v, d))
		}
	}
	extra := func(what string, got, def []string) {
		var left []string
		for _, g := range got {
			if !slices.Contains(def, g) {
				left = append(left, g)
			}
		}
		if len(left) > 0 {
			out = append(out, fmt.Sprintf("backend %d: %s %s", s.PID, what, strings.Join(left, ", ")))
		}
	}
	extra("LISTEN", s.Listening, defaults.Listening)
	extra("prepared statements", s.PreparedStatements, defaults.PreparedStatements)
	extra("advisory locks", s.AdvisoryLocks, defaults.AdvisoryLocks)
	extra("temp tables", s.TempTables, defaults.TempTables)
	extra("held cursors", s.HoldCursors, defaults.HoldCursors)
	return out
}

// ServerSessions inspects every server connection pgbouncer holds for
// database and user, one ServerSession per backend.
//
// It opens PoolSize client connections through pgbouncer and has each BEGIN
// and stay in its transaction: pgbouncer gives a client in a transaction its
// server connection until the transaction ends, so each client is pinned to
// a different server connection, and with the whole pool pinned every server
// connection of the pool is one of them. Each reads its backend's state, and
// all roll back. Filling the pool rather than opening one client per server
// connection seen in SHOW SERVERS is what makes this hold while other
// clients use the pool: pgbouncer opens a new server connection for a client
// rather than wait for a busy one while the pool has room, so fewer clients
// could all land on new connections and miss a busy one. The price is that
// the pool grows to PoolSize fresh connections, which carry no state.
//
// It fails unless every backend that SHOW SERVERS lists while the pool is
// pinned was visited (cancel-request connections, which have no session,
// aside: a client giving up on a query makes pgbouncer open one). With no server connection for database and user it
// returns none.
//
// Call it while the clients under test are idle: a client that keeps a
// server connection (an open transaction, or any connected client in
// session mode) makes the call wait for it until ctx ends.
func (b *Bouncer) ServerSessions(ctx context.Context, database, user string) ([]ServerSession, error) {
	before, err := b.Admin(ctx)
	if err != nil {
		return nil, fmt.Errorf("server sessions: %w", err)
	}
	if len(before.ServersOf(database, user)) == 0 {
		return nil, nil
	}

	var txs []pgx.Tx
	var conns []*pgx.Conn
	defer func() {
		bg := context.WithoutCancel(ctx)
		for _, tx := range txs {
			tx.Rollback(bg) //nolint:errcheck // read-only; closing the connection ends it anyway
		}
		for _, c := range conns {
			c.Close(bg)
		}
	}()
	seen := map[int]ServerSession{}
	var order []int
	for i := 0; i < b.PoolSize; i++ {
		conn, err := connect(ctx, b.URL(database, user))
		if err != nil {
			return nil, fmt.Errorf("server sessions: client %d: %w", i+1, err)
		}
		conns = append(conns, conn)
		tx, err := conn.Begin(ctx)
		if err != nil {
			return nil, fmt.Errorf("server sessions: client %d: begin: %w", i+1, err)
		}
		txs = append(txs, tx)
		s, err := readSession(ctx, tx)
		if err != nil {
			return nil, fmt.Errorf("server sessions: client %d: %w", i+1, err)
		}
		if _, dup := seen[s.PID]; dup {
			// Cannot happen while every earlier client holds its
			// transaction open; it would mean pgbouncer is not pinning.
			return nil, fmt.Errorf("server sessions: clients in open transactions share backend %d (pool_mode %s)", s.PID, b.Mode)
		}
		seen[s.PID] = s
		order = append(order, s.PID)
	}

	pinned, err := b.Admin(ctx)
	if err != nil {
		return nil, fmt.Errorf("server sessions: %w", err)
	}
	// A server connection listed before but closed meanwhile carries no
	// state any more; one still listed now must have been visited.
	var missing []string
	for _, s := range pinned.ServersOf(database, user) {
		if _, ok := seen[s.RemotePID]; !ok && s.HasSession() {
			missing = append(missing, fmt.Sprintf("%d (%s)", s.RemotePID, s.State))
		}
	}
	if len(missing) > 0 {
		return nil, fmt.Errorf("server sessions: %d pinned clients did not reach backends %v of SHOW SERVERS (visited %v)", b.PoolSize, missing, order)
	}
	out := make([]ServerSession, 0, len(order))
	for _, pid := range order {
		out = append(out, seen[pid])
	}
	return out, nil
}

// Leaks inspects every server connection for database and user and lists
// every difference from a fresh direct connection's state: empty means no
// server connection holds an advisory lock, a LISTEN, a prepared statement,
// a temp table, a held cursor or a changed setting. A test asserts it in one
// line.
//
// Settings named in ignore are not compared. application_name needs that
// when the code under test names its connections at connect time (idemd's
// daemons do, in daemon.NewPool): pgbouncer sets a named client's own
// application_name whenever it hands it a server connection and never sets
// it back, so the last name stays on the server connection. Only a client
// that connects without a name sees it, and the harness's own clients are
// such clients, so that they see a name SET by an earlier client too.
func (b *Bouncer) Leaks(ctx context.Context, database, user string, ignore ...string) ([]string, error) {
	defaults, err := Defaults(ctx, b.DirectURL(database, user))
	if err != nil {
		return nil, fmt.Errorf("leaks: %w", err)
	}
	sessions, err := b.ServerSessions(ctx, database, user)
	if err != nil {
		return nil, fmt.Errorf("leaks: %w", err)
	}
	var out []string
	for _, s := range sessions {
		out = append(out, s.Diff(defaults, ignore...)...)
	}
	return out, nil
}
