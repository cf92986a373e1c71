// Package pgbouncer runs a real PgBouncer process (Debian's pgbouncer
// binary) in front of a PostgreSQL server, with its own config in a
// temporary directory and on a free port. It is the process-starting core of
// internal/testing/pgbouncertest (whose Start wraps Run for tests) and is used
// without a testing.TB by the enqueuer benchmark (internal/bench/report),
// which measures the enqueuer through a transaction-mode pooler.
//
// It is a harness, not a deployment: trust authentication, no TLS, no unix
// socket.
package pgbouncer

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// Options configure one pgbouncer.
type Options struct {
	// Mode is pgbouncer's pool_mode: "transaction" (the default) or
	// "session".
	Mode string
	// PoolSize is default_pool_size: server connections per database/user
	// pair. Default 4.
	PoolSize int
	// Users are roles besides postgres that clients may connect as. They
	// must exist on the server; pgbouncer only needs them in its auth_file.
	Users []string
	// BackendURL is an admin URL (database postgres, user postgres, trust
	// auth) of the server to pool. Required.
	BackendURL string
	// Logf, if set, receives a line for each failed start attempt and for
	// a pgbouncer that has to be killed when stopped.
	Logf func(format string, args ...any)
}

// Process is one running pgbouncer.
type Process struct {
	// Mode and PoolSize are the effective pool_mode and default_pool_size.
	Mode     string
	PoolSize int
	// Addr is host:port pgbouncer listens on.
	Addr string
	// Dir holds pgbouncer.ini, userlist.txt and pgbouncer.log; Stop
	// removes it.
	Dir string
	// BackendURL is the server's admin URL, from Options.
	BackendURL string

	logf   func(string, ...any)
	cmd    *exec.Cmd
	exited chan struct{} // closed when the process has been reaped
	waitMu sync.Mutex
	err    error // the process's exit status, valid once exited is closed
}

const (
	DefaultPoolSize = 4
	readyTimeout    = 20 * time.Second
	stopTimeout     = 10 * time.Second
	// Starting on a port that was free a moment ago can lose a race with
	// another process; a fresh port is tried this many times.
	startAttempts = 3
)

// ErrNoBinary is returned by Run when there is no pgbouncer binary.
var ErrNoBinary = errors.New("pgbouncer: no pgbouncer binary on this machine; scripts/ensure-pgbouncer.sh installs it")

// Binary returns the path of the pgbouncer binary, or "" when there is none.
// Debian installs it in /usr/sbin, which a non-root PATH may lack.
func Binary() string {
	if p, err := exec.LookPath("pgbouncer"); err == nil {
		return p
	}
	if st, err := os.Stat("/usr/sbin/pgbouncer"); err == nil && st.Mode().IsRegular() && st.Mode()&0o111 != 0 {
		return "/usr/sbin/pgbouncer"
	}
	return ""
}

// Run starts a pgbouncer in front of opts.BackendURL's server and returns
// once it answers a real query through to the server (or ctx ends). stop
// ends it (SIGTERM, then SIGKILL after 10s), removes its directory, and
// returns an error if pgbouncer had already exited on its own before stop
// was called. stop must be called once; on an error from Run there is
// nothing to stop.
func Run(ctx context.Context, opts Options) (p *Process, stop func() error, err error) {
	bin := Binary()
	if bin == "" {
		return nil, nil, ErrNoBinary
	}
	if opts.Mode == "" {
		opts.Mode = "transaction"
	}
	if opts.Mode != "transaction" && opts.Mode != "session" {
		return nil, nil, fmt.Errorf("pgbouncer: Options.Mode %q: want transaction or session", opts.Mode)
	}
	if opts.PoolSize <= 0 {
		opts.PoolSize = DefaultPoolSize
	}
	if opts.BackendURL == "" {
		return nil, nil, errors.New("pgbouncer: Options.BackendURL is required")
	}
	logf := opts.Logf
	if logf == nil {
		logf = func(string, ...any) {}
	}
	u, err := url.Parse(opts.BackendURL)
	if err != nil {
		return nil, nil, fmt.Errorf("pgbouncer: parse the server URL: %w", err)
	}
	backendHost, backendPort := u.Hostname(), u.Port()
	if backendPort == "" {
		backendPort = "5432"
	}

	cred, err := runAs()
	if err != nil {
		return nil, nil, fmt.Errorf("pgbouncer: %w", err)
	}
	dir, err := os.MkdirTemp("", "pgbouncertest-")
	if err != nil {
		return nil, nil, fmt.Errorf("pgbouncer: temp dir: %w", err)
	}
	p = &Process{Mode: opts.Mode, PoolSize: opts.PoolSize, Dir: dir, BackendURL: opts.BackendURL, logf: logf}

	var lastErr error
	for attempt := 1; attempt <= startAttempts; attempt++ {
		addr, err := freeAddr()
		if err != nil {
			os.RemoveAll(dir)
			return nil, nil, fmt.Errorf("pgbouncer: %w", err)
		}
		if err := writeConfig(dir, addr, backendHost, backendPort, opts, cred); err != nil {
			os.RemoveAll(dir)
			return nil, nil, fmt.Errorf("pgbouncer: %w", err)
		}
		p.Addr = addr
		if err := p.start(bin, cred); err != nil {
			os.RemoveAll(dir)
			return nil, nil, fmt.Errorf("pgbouncer: %w", err)
		}
		lastErr = p.waitReady(ctx)
		if lastErr == nil {
			return p, p.stop, nil
		}
		p.kill()
		if ctx.Err() != nil {
			break
		}
		logf("pgbouncer: start attempt %d on %s: %v", attempt, addr, lastErr)
	}
	tail := p.LogTail(40)
	os.RemoveAll(dir)
	return nil, nil, fmt.Errorf("pgbouncer: pgbouncer did not become ready: %w\n--- pgbouncer log tail:\n%s", lastErr, tail)
}

// credential is whom pgbouncer runs as: nil means the current user.
type credential struct {
	uid, gid uint32
}

// runAs returns the postgres OS user's ids when running as root: pgbouncer
// refuses to run as root ("PgBouncer should not run as root").
func runAs() (*credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	pg, err := user.Lookup("postgres")
	if err != nil {
		return nil, fmt.Errorf("running as root and pgbouncer refuses root: look up the postgres OS user: %w", err)
	}
	uid, err := strconv.ParseUint(pg.Uid, 10, 32)
	if err != nil {
		return nil, fmt.Errorf("postgres uid %q: %w", pg.Uid, err)
	}
	gid, err := strconv.ParseUint(pg.Gid, 10, 32)
	if err != nil {
		return nil, fmt.Errorf("postgres gid %q: %w", pg.Gid, err)
	}
	return &credential{uid: uint32(uid), gid: uint32(gid)}, nil
}

func freeAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", fmt.Errorf("free port: %w", err)
	}
	defer l.Close()
	return l.Addr().String(), nil
}

// writeConfig writes pgbouncer.ini and userlist.txt into dir, owned by the
// user pgbouncer runs as (it reads both and writes its log there).
func writeConfig(dir, addr, backendHost, backendPort string, opts Options, cred *credential) error {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("split listen address %q: %w", addr, err)
	}
	users := append([]string{"postgres"}, opts.Users...)
	var userlist strings.Builder
	for _, u := range users {
		// auth_type=trust still needs each user in the auth_file; the
		// password is never checked.
		fmt.Fprintf(&userlist, "%q \"\"\n", u)
	}
	ini := fmt.Sprintf(`; written by internal/testing/pgbouncer
[databases]
; any database name goes through, so every test database works
* = host=%s port=%s

[pgbouncer]
listen_addr = %s
listen_port = %s
; no unix socket: clients use TCP, and a socket in /tmp could collide
; with another process's
unix_socket_dir =
auth_type = trust
auth_file = %s
admin_users = postgres
pool_mode = %s
default_pool_size = %d
max_client_conn = 200
logfile = %s
pidfile =
`, backendHost, backendPort, host, port, filepath.Join(dir, "userlist.txt"), opts.Mode, opts.PoolSize, filepath.Join(dir, "pgbouncer.log"))
	// server_reset_query stays at its default (DISCARD ALL), used in session
	// mode only. ignore_startup_parameters stays empty: pgx sends no startup
	// parameter besides user and database unless the URL asks for one, and
	// application_name (the usual one) is tracked by pgbouncer itself.
	files := map[string]string{"pgbouncer.ini": ini, "userlist.txt": userlist.String()}
	for name, content := range files {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			return fmt.Errorf("write %s: %w", name, err)
		}
	}
	if cred != nil {
		for _, p := range []string{dir, filepath.Join(dir, "pgbouncer.ini"), filepath.Join(dir, "userlist.txt")} {
			if err := os.Chown(p, int(cred.uid), int(cred.gid)); err != nil {
				return fmt.Errorf("chown %s to the postgres user: %w", p, err)
			}
		}
	}
	return nil
}

func (p *Process) start(bin string, cred *credential) error {
	stderr, err := os.OpenFile(filepath.Join(p.Dir, "stderr.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("open stderr log: %w", err)
	}
	// -q: pgbouncer would copy every log line to stderr; stderr.log then
	// keeps only what it prints before its logfile is open.
	cmd := exec.Command(bin, "-q", filepath.Join(p.Dir, "pgbouncer.ini"))
	cmd.Dir = p.Dir
	cmd.Stdout, cmd.Stderr = stderr, stderr
	// Pdeathsig: a process that dies (a panic, go test's timeout) takes its
	// pgbouncer with it instead of leaving it holding server connections.
	// Go sets it after switching credentials, so it survives the switch.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if cred != nil {
		cmd.SysProcAttr.Credential = &syscall.Credential{Uid: cred.uid, Gid: cred.gid, Groups: []uint32{}}
	}
	if err := cmd.Start(); err != nil {
		stderr.Close()
		return fmt.Errorf("start %s: %w", bin, err)
	}
	stderr.Close() // the child has its own descriptor
	p.cmd = cmd
	p.exited = make(chan struct{})
	go func(cmd *exec.Cmd, exited chan struct{}) {
		err := cmd.Wait()
		p.waitMu.Lock()
		p.err = err
		p.waitMu.Unlock()
		close(exited)
	}(cmd, p.exited)
	return nil
}

// waitReady polls until pgbouncer answers a query through to the server, or
// exits, or readyTimeout passes, or ctx ends.
func (p *Process) waitReady(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, readyTimeout)
	defer cancel()
	// A real query through to the server proves the [databases] line and
	// the auth setup, not only that pgbouncer listens. Database postgres is
	// never dropped, so the idle server connection this leaves in its pool
	// is harmless.
	target := p.URL("postgres", "postgres")
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	var lastErr error
	for {
		select {
		case <-p.exited:
			return fmt.Errorf("pgbouncer exited before it was ready: %v", p.exitErr())
		default:
		}
		lastErr = pingThrough(ctx, target)
		if lastErr == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("no answer within %s: %w", readyTimeout, lastErr)
		case <-p.exited:
		case <-tick.C:
		}
	}
}

func (p *Process) exitErr() error {
	p.waitMu.Lock()
	defer p.waitMu.Unlock()
	return p.err
}

func pingThrough(ctx context.Context, target string) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	cfg, err := pgx.ParseConfig(target)
	if err != nil {
		return err
	}
	// The simple protocol: nothing prepared on a server connection.
	cfg.DefaultQueryExecMode = pgx.QueryExecModeSimpleProtocol
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return fmt.Errorf("connect through pgbouncer: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var one int
	if err := conn.QueryRow(ctx, "SELECT 1").Scan(&one); err != nil {
		return fmt.Errorf("select 1 through pgbouncer: %w", err)
	}
	return nil
}

// Exited reports whether pgbouncer has exited on its own, and its exit
// status.
func (p *Process) Exited() (bool, error) {
	select {
	case <-p.exited:
		return true, p.exitErr()
	default:
		return false, nil
	}
}

// stop stops pgbouncer (SIGTERM is an immediate shutdown in pgbouncer 1.18:
// it closes client and server connections without waiting for them) and
// waits for it, SIGKILL if it hangs, then removes its directory. It returns
// an error if pgbouncer had exited before.
func (p *Process) stop() error {
	defer os.RemoveAll(p.Dir)
	if exited, err := p.Exited(); exited {
		return fmt.Errorf("pgbouncer exited before it was stopped: %v\n--- pgbouncer log tail:\n%s", err, p.LogTail(40))
	}
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil && !errors.Is(err, os.ErrProcessDone) {
		p.logf("pgbouncer: SIGTERM pgbouncer: %v", err)
	}
	select {
	case <-p.exited:
	case <-time.After(stopTimeout):
		p.logf("pgbouncer: pgbouncer still running %s after SIGTERM; killing it\n--- pgbouncer log tail:\n%s", stopTimeout, p.LogTail(20))
		p.kill()
	}
	return nil
}

// kill SIGKILLs the process and waits for it to be reaped.
func (p *Process) kill() {
	if p.cmd == nil {
		return
	}
	_ = p.cmd.Process.Kill() // already gone is fine
	<-p.exited
}

// LogTail returns the last n lines of pgbouncer's log (and whatever it
// printed before opening the log), for failure messages.
func (p *Process) LogTail(n int) string {
	var out []string
	for _, name := range []string{"stderr.log", "pgbouncer.log"} {
		data, err := os.ReadFile(filepath.Join(p.Dir, name))
		if err != nil || len(data) == 0 {
			continue
		}
		lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
		if len(lines) > n {
			lines = lines[len(lines)-n:]
		}
		out = append(out, "["+name+"]")
		out = append(out, lines...)
	}
	if len(out) == 0 {
		return "(empty)"
	}
	return strings.Join(out, "\n")
}

// URL is a connection URL through pgbouncer to database as user.
func (p *Process) URL(database, user string) string {
	u := url.URL{
		Scheme:   "postgres",
		User:     url.User(user),
		Host:     p.Addr,
		Path:     "/" + database,
		RawQuery: "sslmode=disable",
	}
	return u.String()
}

// DirectURL is a connection URL straight to the server (not through
// pgbouncer) for database as user.
func (p *Process) DirectURL(database, user string) string {
	u, err := url.Parse(p.BackendURL)
	if err != nil {
		panic(fmt.Sprintf("pgbouncer: parse server URL: %v", err)) // parsed once in Run already
	}
	u.Path = "/" + database
	if u.User.Username() != user {
		// A different role: trust auth is assumed, as for pgbouncer.
		u.User = url.User(user)
	}
	return u.String()
}
