// Package pgbouncertest runs a real PgBouncer (Debian's pgbouncer binary)
// between a test and the PostgreSQL server internal/dbtest uses, so a test
// can prove a guarantee holds behind a transaction-mode connection pooler:
// that nothing depends on two transactions of one client connection reaching
// the same backend, and that no session state (advisory locks, LISTEN,
// prepared statements, changed settings) is left on the pooled server
// connections for the next client to inherit.
//
// Each Start runs its own pgbouncer process on a free port with its own
// config in a temporary directory, and stops it when the test ends. The
// binary comes from scripts/ensure-pgbouncer.sh; without it the test is
// skipped, or fails under CI=true.
//
// Call dbtest.NewDatabase before Start: cleanups run last-registered first,
// so pgbouncer is stopped (and its server connections closed) before dbtest
// drops the database. The other order is safe too (dbtest drops WITH
// (FORCE), which terminates pgbouncer's server connections), only noisier in
// pgbouncer's log.
package pgbouncertest

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
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"idemd/internal/dbtest"
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
	// BackendURL is an admin URL (database postgres) of the server to pool;
	// empty: the server internal/dbtest uses. The fault suite pools its own
	// cluster.
	BackendURL string
}

// Bouncer is one running pgbouncer.
type Bouncer struct {
	// Mode and PoolSize are the effective pool_mode and default_pool_size.
	Mode     string
	PoolSize int
	// Addr is host:port pgbouncer listens on.
	Addr string
	// Dir holds pgbouncer.ini, userlist.txt and pgbouncer.log.
	Dir string

	backendURL string // the server's admin URL, from dbtest.ServerURL
	tb         testing.TB

	cmd    *exec.Cmd
	exited chan struct{} // closed when the process has been reaped
	waitMu sync.Mutex
	err    error // the process's exit status, valid once exited is closed

	// stopLoad ends every Load when the test ends, before pgbouncer is
	// stopped, so no load goroutine outlives the test (dbtest.Main checks
	// for leaked goroutines).
	stopCtx  context.Context
	stopLoad context.CancelFunc
	loads    sync.WaitGroup
}

const (
	defaultPoolSize = 4
	readyTimeout    = 20 * time.Second
	stopTimeout     = 10 * time.Second
	// Starting on a port that was free a moment ago can lose a race with
	// another process; a fresh port is tried this many times.
	startAttempts = 3
)

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

// Start runs a pgbouncer in front of dbtest's server and stops it when the
// test ends. It returns once pgbouncer answers a real query through to the
// server.
func Start(tb testing.TB, opts Options) *Bouncer {
	tb.Helper()
	bin := Binary()
	if bin == "" {
		if os.Getenv("CI") == "true" {
			tb.Fatalf("pgbouncertest: no pgbouncer binary on this machine (CI=true); scripts/ensure-pgbouncer.sh installs it")
		}
		tb.Skip("pgbouncertest: no pgbouncer binary on this machine; run scripts/ensure-pgbouncer.sh")
	}
	if opts.Mode == "" {
		opts.Mode = "transaction"
	}
	if opts.Mode != "transaction" && opts.Mode != "session" {
		tb.Fatalf("pgbouncertest: Options.Mode %q: want transaction or session", opts.Mode)
	}
	if opts.PoolSize <= 0 {
		opts.PoolSize = defaultPoolSize
	}
	backend := opts.BackendURL
	if backend == "" {
		backend = dbtest.ServerURL(tb)
	}
	u, err := url.Parse(backend)
	if err != nil {
		tb.Fatalf("pgbouncertest: parse dbtest's server URL: %v", err)
	}
	backendHost, backendPort := u.Hostname(), u.Port()
	if backendPort == "" {
		backendPort = "5432"
	}

	cred, err := runAs()
	if err != nil {
		tb.Fatalf("pgbouncertest: %v", err)
	}
	dir, err := os.MkdirTemp("", "pgbouncertest-")
	if err != nil {
		tb.Fatalf("pgbouncertest: temp dir: %v", err)
	}
	tb.Cleanup(func() { os.RemoveAll(dir) })

	stopCtx, stopLoad := context.WithCancel(context.Background())
	b := &Bouncer{Mode: opts.Mode, PoolSize: opts.PoolSize, Dir: dir, backendURL: backend, tb: tb, stopCtx: stopCtx, stopLoad: stopLoad}

	var lastErr error
	for attempt := 1; attempt <= startAttempts; attempt++ {
		addr, err := freeAddr()
		if err != nil {
			tb.Fatalf("pgbouncertest: %v", err)
		}
		if err := writeConfig(dir, addr, backendHost, backendPort, opts, cred); err != nil {
			tb.Fatalf("pgbouncertest: %v", err)
		}
		b.Addr = addr
		if err := b.start(bin, cred); err != nil {
			tb.Fatalf("pgbouncertest: %v", err)
		}
		lastErr = b.waitReady()
		if lastErr == nil {
			tb.Cleanup(b.stop)
			return b
		}
		b.kill()
		tb.Logf("pgbouncertest: start attempt %d on %s: %v", attempt, addr, lastErr)
	}
	stopLoad()
	tb.Fatalf("pgbouncertest: pgbouncer did not become ready: %v\n--- pgbouncer log tail:\n%s", lastErr, b.LogTail(40))
	return nil
}

// credential is whom pgbouncer runs as: nil means the current user.
type credential struct {
	uid, gid uint32
}

// runAs returns the postgres OS user's ids when the test runs as root:
// pgbouncer refuses to run as root ("PgBouncer should not run as root").
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
	ini := fmt.Sprintf(`; written by internal/pgbouncertest
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

func (b *Bouncer) start(bin string, cred *credential) error {
	stderr, err := os.OpenFile(filepath.Join(b.Dir, "stderr.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("open stderr log: %w", err)
	}
	// -q: pgbouncer would copy every log line to stderr; stderr.log then
	// keeps only what it prints before its logfile is open.
	cmd := exec.Command(bin, "-q", filepath.Join(b.Dir, "pgbouncer.ini"))
	cmd.Dir = b.Dir
	cmd.Stdout, cmd.Stderr = stderr, stderr
	// Pdeathsig: a test binary that dies (a panic, go test's timeout) takes
	// its pgbouncer with it instead of leaving it holding server
	// connections. Go sets it after switching credentials, so it survives
	// the switch.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if cred != nil {
		cmd.SysProcAttr.Credential = &syscall.Credential{Uid: cred.uid, Gid: cred.gid, Groups: []uint32{}}
	}
	if err := cmd.Start(); err != nil {
		stderr.Close()
		return fmt.Errorf("start %s: %w", bin, err)
	}
	stderr.Close() // the child has its own descriptor
	b.cmd = cmd
	b.exited = make(chan struct{})
	go func(cmd *exec.Cmd, exited chan struct{}) {
		err := cmd.Wait()
		b.waitMu.Lock()
		b.err = err
		b.waitMu.Unlock()
		close(exited)
	}(cmd, b.exited)
	return nil
}

// waitReady polls until pgbouncer answers a query through to the server, or
// exits, or readyTimeout passes.
func (b *Bouncer) waitReady() error {
	ctx, cancel := context.WithTimeout(context.Background(), readyTimeout)
	defer cancel()
	// A real query through to the server proves the [databases] line and
	// the auth setup, not only that pgbouncer listens. Database postgres is
	// never dropped by the tests, so the idle server connection this leaves
	// in its pool is harmless.
	target := b.URL("postgres", "postgres")
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	var lastErr error
	for {
		select {
		case <-b.exited:
			b.waitMu.Lock()
			err := b.err
			b.waitMu.Unlock()
			return fmt.Errorf("pgbouncer exited before it was ready: %v", err)
		default:
		}
		lastErr = pingThrough(ctx, target)
		if lastErr == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("no answer within %s: %w", readyTimeout, lastErr)
		case <-b.exited:
		case <-tick.C:
		}
	}
}

func pingThrough(ctx context.Context, target string) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	conn, err := connect(ctx, target)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var one int
	if err := conn.QueryRow(ctx, "SELECT 1").Scan(&one); err != nil {
		return fmt.Errorf("select 1 through pgbouncer: %w", err)
	}
	return nil
}

// connect opens a connection in the simple protocol: the harness's own
// queries must leave no prepared statement on a server connection (that is
// one of the things it looks for), and the admin console speaks only the
// simple protocol.
func connect(ctx context.Context, connURL string) (*pgx.Conn, error) {
	cfg, err := pgx.ParseConfig(connURL)
	if err != nil {
		return nil, fmt.Errorf("parse %s: %w", connURL, err)
	}
	cfg.DefaultQueryExecMode = pgx.QueryExecModeSimpleProtocol
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("connect %s: %w", redact(connURL), err)
	}
	return conn, nil
}

func redact(connURL string) string {
	u, err := url.Parse(connURL)
	if err != nil {
		return "(unparsable URL)"
	}
	return u.Redacted()
}

// stop ends every Load, then stops pgbouncer (SIGTERM is an immediate
// shutdown in pgbouncer 1.18: it closes client and server connections
// without waiting for them) and waits for it. SIGKILL follows if it hangs.
func (b *Bouncer) stop() {
	b.stopLoad()
	b.loads.Wait()
	if b.cmd == nil {
		return
	}
	select {
	case <-b.exited:
		b.waitMu.Lock()
		err := b.err
		b.waitMu.Unlock()
		b.tb.Errorf("pgbouncertest: pgbouncer exited during the test: %v\n--- pgbouncer log tail:\n%s", err, b.LogTail(40))
		return
	default:
	}
	if err := b.cmd.Process.Signal(syscall.SIGTERM); err != nil && !errors.Is(err, os.ErrProcessDone) {
		b.tb.Logf("pgbouncertest: SIGTERM pgbouncer: %v", err)
	}
	select {
	case <-b.exited:
	case <-time.After(stopTimeout):
		b.tb.Logf("pgbouncertest: pgbouncer still running %s after SIGTERM; killing it\n--- pgbouncer log tail:\n%s", stopTimeout, b.LogTail(20))
		b.kill()
	}
}

// kill SIGKILLs the process and waits for it to be reaped.
func (b *Bouncer) kill() {
	if b.cmd == nil {
		return
	}
	_ = b.cmd.Process.Kill() // already gone is fine
	<-b.exited
}

// LogTail returns the last n lines of pgbouncer's log (and whatever it
// printed before opening the log), for failure messages.
func (b *Bouncer) LogTail(n int) string {
	var out []string
	for _, name := range []string{"stderr.log", "pgbouncer.log"} {
		data, err := os.ReadFile(filepath.Join(b.Dir, name))
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
//
// Behind transaction pooling (pgbouncer 1.18 has no prepared statement
// support) a client must not rely on named prepared statements: pgx's
// default statement cache prepares one per query on whichever server
// connection it happens to use. Code under test chooses its own
// default_query_exec_mode; the URL leaves pgx's default so that a test sees
// what the code really does.
func (b *Bouncer) URL(database, user string) string {
	u := url.URL{
		Scheme:   "postgres",
		User:     url.User(user),
		Host:     b.Addr,
		Path:     "/" + database,
		RawQuery: "sslmode=disable",
	}
	return u.String()
}

// DirectURL is a connection URL straight to the server (not through
// pgbouncer) for database as user.
func (b *Bouncer) DirectURL(database, user string) string {
	u, err := url.Parse(b.backendURL)
	if err != nil {
		panic(fmt.Sprintf("pgbouncertest: parse server URL: %v", err)) // parsed once in Start already
	}
	u.Path = "/" + database
	if u.User.Username() != user {
		// A different role: trust auth is assumed, as for pgbouncer.
		u.User = url.User(user)
	}
	return u.String()
}

// DatabaseName is the database name of a URL such as dbtest.NewDatabase's.
func DatabaseName(tb testing.TB, connURL string) string {
	tb.Helper()
	u, err := url.Parse(connURL)
	if err != nil {
		tb.Fatalf("pgbouncertest: parse %s: %v", redact(connURL), err)
	}
	name := strings.TrimPrefix(u.Path, "/")
	if name == "" {
		tb.Fatalf("pgbouncertest: %s names no database", redact(connURL))
	}
	return name
}
