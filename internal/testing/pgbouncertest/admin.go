package pgbouncertest

import (
	"context"
	"fmt"
	"strconv"
)

// Server is one row of SHOW SERVERS: one server connection pgbouncer holds.
type Server struct {
	Type     string // "S"
	User     string
	Database string
	// State is active, idle, used, tested or new (pgbouncer's sv_* lists).
	State           string
	Addr            string
	Port            int
	LocalAddr       string
	LocalPort       int
	RemotePID       int // the backend's pid (pg_backend_pid() on it); 0 while logging in
	ApplicationName string
}

// HasSession reports whether the row is a backend session a client could
// be handed: not a connection pgbouncer opened only to deliver a cancel
// request (state active_cancel, pgbouncer 1.18+), nor one still logging in;
// neither has a remote_pid or any session state.
func (s Server) HasSession() bool {
	return s.RemotePID != 0 && s.State != "active_cancel"
}

// Pool is one row of SHOW POOLS.
type Pool struct {
	Database, User      string
	ClActive, ClWaiting int
	SvActive, SvIdle    int
	SvUsed, SvTested    int
	SvLogin             int
	PoolMode            string
}

// AdminState is what the admin console says at one moment.
type AdminState struct {
	Servers []Server
	Pools   []Pool
}

// ServersOf returns the server connections for database and user.
func (a AdminState) ServersOf(database, user string) []Server {
	var out []Server
	for _, s := range a.Servers {
		if s.Database == database && s.User == user {
			out = append(out, s)
		}
	}
	return out
}

// Admin runs SHOW SERVERS and SHOW POOLS on pgbouncer's admin console.
func (b *Bouncer) Admin(ctx context.Context) (AdminState, error) {
	servers, err := b.AdminCommand(ctx, "SHOW SERVERS")
	if err != nil {
		return AdminState{}, err
	}
	pools, err := b.AdminCommand(ctx, "SHOW POOLS")
	if err != nil {
		return AdminState{}, err
	}
	var st AdminState
	for _, r := range servers {
		st.Servers = append(st.Servers, Server{
			Type: r["type"], User: r["user"], Database: r["database"], State: r["state"],
			Addr: r["addr"], Port: atoi(r["port"]), LocalAddr: r["local_addr"], LocalPort: atoi(r["local_port"]),
			RemotePID: atoi(r["remote_pid"]), ApplicationName: r["application_name"],
		})
	}
	for _, r := range pools {
		st.Pools = append(st.Pools, Pool{
			Database: r["database"], User: r["user"],
			ClActive: atoi(r["cl_active"]), ClWaiting: atoi(r["cl_waiting"]),
			SvActive: atoi(r["sv_active"]), SvIdle: atoi(r["sv_idle"]),
			SvUsed: atoi(r["sv_used"]), SvTested: atoi(r["sv_tested"]),
			SvLogin: atoi(r["sv_login"]), PoolMode: r["pool_mode"],
		})
	}
	return st, nil
}

// AdminCommand runs one command on pgbouncer's admin console (database
// "pgbouncer", user postgres) and returns its rows as column name → text
// value. Commands without rows (RECONNECT db, KILL db, RESUME db) return
// none.
func (b *Bouncer) AdminCommand(ctx context.Context, command string) ([]map[string]string, error) {
	// The console answers only the simple query protocol; connect sets it.
	conn, err := connect(ctx, b.URL("pgbouncer", "postgres"))
	if err != nil {
		return nil, fmt.Errorf("pgbouncer admin console: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	rows, err := conn.Query(ctx, command)
	if err != nil {
		return nil, fmt.Errorf("pgbouncer admin %q: %w", command, err)
	}
	defer rows.Close()
	var out []map[string]string
	for rows.Next() {
		fields := rows.FieldDescriptions()
		raw := rows.RawValues() // text format: the simple protocol
		row := make(map[string]string, len(fields))
		for i, f := range fields {
			if raw[i] != nil {
				row[f.Name] = string(raw[i])
			}
		}
		out = append(out, row)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("pgbouncer admin %q: %w", command, err)
	}
	return out, nil
}

// atoi reads a number column; an empty or odd value reads as 0, which is
// what pgbouncer means by an absent remote_pid or port.
func atoi(s string) int {
	n, err := strconv.Atoi(s)
	if err != nil {
		return 0
	}
	return n
}
