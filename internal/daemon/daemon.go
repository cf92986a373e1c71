// Package daemon is the runtime every idemd command shares: configuration
// (exit 2 with every problem listed), zap logging, a pgx pool named after the
// command, the ops HTTP server, and SIGTERM handling with a bounded drain.
package daemon

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/alecthomas/kong"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/multitracer"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"go.uber.org/zap"

	"github.com/idemd/idemd/internal/buildinfo"
	"github.com/idemd/idemd/internal/config"
	"github.com/idemd/idemd/internal/dbcall"
	"github.com/idemd/idemd/internal/dbcred"
	"github.com/idemd/idemd/internal/logging"
	"github.com/idemd/idemd/internal/opshttp"
)

// Exit codes of docs/design.md's operator contract.
const (
	ExitOK      = 0
	ExitRuntime = 1 // runtime failure, retryable
	ExitConfig  = 2 // bad configuration or usage
	// ExitRefused: the command ran and the database said no (the row does
	// not exist, or the action does not apply to it as it is); nothing was
	// changed and running it again will not help.
	ExitRefused = 3
)

// Refusal is implemented by an error that means ExitRefused (the
// operator core's not-found and refused errors).
type Refusal interface {
	error
	Refusal()
}

// Command is a parsed CLI that can run.
type Command interface {
	CommonConfig() *config.Common
	// Run does the command's work until ctx is cancelled (SIGTERM) or the
	// work is done. Long-running commands must return within
	// ShutdownTimeout of ctx being cancelled.
	Run(ctx context.Context, env *Env) error
	// LongRunning says, once the flags are parsed, whether this run keeps
	// going until SIGTERM (a Deployment) or does one piece of work and
	// exits (--once, --dry-run, a CronJob, an operator at a terminal). Only
	// a long-running run serves /healthz, /readyz and /metrics on the
	// default --http-addr (:9090); a one-shot run serves them only on an
	// address given explicitly (the flag or IDEMD_HTTP_ADDR), so it can run
	// next to a daemon that holds :9090.
	LongRunning() bool
}

// Env is what Main builds for a command.
type Env struct {
	Name   string
	Logger *zap.Logger
	Pool   *pgxpool.Pool
	// Calls bounds every database call by --database-timeout where no
	// timeout of its own applies (internal/dbcall).
	Calls    *dbcall.Bounds
	Registry *prometheus.Registry
	Ready    *opshttp.Readiness
	Stdout   io.Writer
	// OpsAddr is the address the ops server bound ("" when none: disabled,
	// or a one-shot run without an explicit --http-addr).
	OpsAddr string
}

// Main parses args into cmd, runs it and returns the process exit code.
func Main(name, description string, cmd Command, args []string) int {
	return MainWith(name, description, cmd, args, os.Stdout, os.Stderr)
}

// Base is what every idemd command runs on: a context cancelled by SIGTERM
// or SIGINT, the logger, and a pool named after the command.
type Base struct {
	Ctx    context.Context
	Logger *zap.Logger
	Pool   *pgxpool.Pool
	// Calls bounds the command's database calls (--database-timeout).
	Calls *dbcall.Bounds
	// Collectors are the pool's own metrics (internal/dbcred): refused
	// logins, and unreadable credential files with
	// --database-password-file; and the calls that ran out of their
	// bound (internal/dbcall).
	Collectors []prometheus.Collector
	// UnknownEnv are the IDEMD_* variables of the environment that no flag
	// reads (a typo): the command tells them once at start, a daemon in
	// its log (LogUnknownEnv), idemctl on stderr.
	UnknownEnv []config.UnknownVar
	close      []func()
}

// LogUnknownEnv logs one warning for each IDEMD_* variable no flag reads.
func LogUnknownEnv(logger *zap.Logger, unknown []config.UnknownVar) {
	for _, u := range unknown {
		logger.Warn("an IDEMD_ environment variable is not a setting of this command and is ignored",
			zap.String("variable", u.Name), zap.String("did_you_mean", u.Nearest))
	}
}

// Close closes the pool, stops listening for signals and flushes the log.
func (b *Base) Close() {
	for i := len(b.close) - 1; i >= 0; i-- {
		b.close[i]()
	}
}

// versionFlag is every command's --version, embedded by Setup so that no
// command has to declare it. Never from the environment: an IDEMD_VERSION a
// deployment sets for its own purposes must not turn a daemon into a
// version printer.
type versionFlag struct {
	Version kong.VersionFlag `name:"version" env:"-" help:"Print the version, commit and Go version, and exit."`
}

// Setup parses args into cli (every problem listed, exit 2) and builds the
// Base from db and log, which point into cli. A nil Base means the command
// ends now with the returned code: 0 after --help or --version, 2 after a configuration
// problem it has printed to stderr.
func Setup(name, description string, cli any, db *config.Database, log *config.Logging, args []string, stdout, stderr io.Writer) (*kong.Context, *Base, int) {
	kctx, err := config.Parse(name, description, cli, args, stdout,
		kong.Embed(&versionFlag{}), kong.Vars{"version": buildinfo.Line(name)})
	var unknown []config.UnknownVar
	if kctx != nil {
		unknown = config.UnknownEnv(config.KnownEnv(kctx.Model), os.Environ())
	}
	if err != nil {
		if errors.Is(err, config.ErrHelp) {
			return nil, nil, ExitOK
		}
		// A mistyped variable may be why the configuration is wrong.
		for _, u := range unknown {
			fmt.Fprintf(stderr, "%s: warning: %s\n", name, u)
		}
		fmt.Fprintf(stderr, "%s: %v\n", name, err)
		return nil, nil, ExitConfig
	}
	logger, err := logging.New(log.LogFormat, log.LogLevel)
	if err != nil {
		fmt.Fprintf(stderr, "%s: %v\n", name, err)
		return nil, nil, ExitConfig
	}
	// Every error logged about a missing idemd table says to migrate.
	logger = logger.WithOptions(zap.WrapCore(wrapSchemaHint))
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	pool, collectors, err := NewPool(ctx, *db, "idemd-"+name, logger)
	if err != nil {
		stop()
		logger.Sync() //nolint:errcheck
		for _, u := range unknown {
			fmt.Fprintf(stderr, "%s: warning: %s\n", name, u)
		}
		// A URL that does not parse is a configuration error.
		fmt.Fprintf(stderr, "%s: invalid configuration:\n  - --database-url: %v\n", name, err)
		return nil, nil, ExitConfig
	}
	calls := dbcall.New(db.Timeout, logger)
	calls.ResetOnTimeout(pool.Reset)
	b := &Base{Ctx: ctx, Logger: logger, Pool: pool, Calls: calls, Collectors: append(collectors, calls.Collectors()...), UnknownEnv: unknown}
	b.close = []func(){func() { logger.Sync() }, stop, pool.Close} //nolint:errcheck
	return kctx, b, ExitOK
}

// MainWith is Main with explicit output streams (for tests).
func MainWith(name, description string, cmd Command, args []string, stdout, stderr io.Writer) int {
	common := cmd.CommonConfig()
	kctx, base, code := Setup(name, description, cmd, &common.Database, &common.Logging, args, stdout, stderr)
	if base == nil {
		return code
	}
	defer base.Close()
	ctx, pool := base.Ctx, base.Pool
	logger := base.Logger.With(zap.String("component", name))
	LogUnknownEnv(logger, base.UnknownEnv)

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	registerBuildInfo(reg, name)
	reg.MustRegister(base.Collectors...)
	// Not ready while the database lacks a migration the command needs
	// (up to its oldest schema): a rollout waits for the migration Job
	// instead of sending work to a daemon that cannot do it. On a newer
	// schema (a newer release migrated first) it stays ready and says so.
	schema := newSchemaWatch(pool, oldestSchema(cmd), logger, reg)
	ready := &opshttp.Readiness{Ping: pool.Ping, Schema: schema.check, Note: schema.readyNote,
		Database: base.Calls.Fault, CallTimeout: min(opshttp.ProbeTimeout, base.Calls.Timeout())}
	env := &Env{Name: name, Logger: logger, Pool: pool, Calls: base.Calls, Registry: reg, Ready: ready, Stdout: stdout}

	if addr := opsAddr(cmd, kctx, common.HTTPAddr); addr != "" {
		srv, err := opshttp.Start(addr, opshttp.Handler(reg, ready))
		if err != nil {
			logger.Error("ops server failed to start", zap.Error(err))
			return ExitRuntime
		}
		env.OpsAddr = srv.Addr
		defer func() {
			sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if err := srv.Stop(sctx); err != nil {
				logger.Warn("ops server stop", zap.Error(err))
			}
		}()
	}

	runErr := cmd.Run(ctx, env)
	exit := ExitCode(runErr)
	switch {
	case exit == ExitConfig:
		fmt.Fprintf(stderr, "%s: %v\n", name, runErr)
	case runErr != nil && !alreadyLogged(runErr):
		logger.Error("failed", zap.Error(runErr))
	}
	return exit
}

// ExitCode is the one mapping from a command's error to its exit code, for
// the daemons and idemctl alike: nil is 0, a *config.Error (bad flags or
// usage) is 2, a Refusal (not found, refused) is 3, anything else is a
// runtime failure, 1, which a CronJob or a restart may retry.
func ExitCode(err error) int {
	var cerr *config.Error
	switch {
	case err == nil:
		return ExitOK
	case errors.As(err, &cerr):
		return ExitConfig
	case refused(err):
		return ExitRefused
	default:
		return ExitRuntime
	}
}

// refused reports whether err is a Refusal: itself, through the errors it
// wraps, and for an error that joins several (dead requeue of many ids),
// every one of them. One failure that was not a refusal (the database went
// away) makes the whole a runtime failure: running it again may help.
func refused(err error) bool {
	if _, ok := err.(Refusal); ok {
		return true
	}
	switch u := err.(type) {
	case interface{ Unwrap() []error }:
		errs := u.Unwrap()
		for _, e := range errs {
			if !refused(e) {
				return false
			}
		}
		return len(errs) > 0
	case interface{ Unwrap() error }:
		if e := u.Unwrap(); e != nil {
			return refused(e)
		}
	}
	return false
}

// opsAddr is the address the ops server listens on: --http-addr for a
// long-running run; for a one-shot run only an address given explicitly,
// else none.
func opsAddr(cmd Command, kctx *kong.Context, addr string) string {
	if cmd.LongRunning() || config.Given(kctx, "http-addr") {
		return addr
	}
	return ""
}

// NewPool builds a pgx pool whose connections carry application_name (unless
// the URL sets one), so pg_stat_activity shows which daemon holds what. It
// does not connect: daemons start even while PostgreSQL is down and report
// that through /readyz rather than crash-looping.
//
// Behind a transaction-mode pooler (db.Pooler "transaction") the pool uses
// unnamed statements whose descriptions pgx caches: still one round trip
// per query, but nothing prepared on a server connection, which such a
// pooler hands to other clients between transactions (a named statement
// then fails with 42P05 or 26000, or is left behind for the API). Without
// it, those errors are logged once with the fix.
//
// With db.PasswordFile (and db.UserFile), every new connection reads its
// credentials from those files (internal/dbcred): the pool's
// BeforeConnect, which connections opened outside the pool apply too
// (dbcred.Connect with pool.Config()). Every connection, the ones outside
// the pool too, is watched for the server refusing its credentials. The
// returned collectors are those two watches' metrics.
//
// Every connection, in the pool and outside it (which copy the pool's
// ConnConfig), ends in bounded time whatever the network does
// (internal/dbcall): TCP keepalives and TCP_USER_TIMEOUT on its socket,
// connect_timeout (db.Timeout unless the URL sets one), and on a direct
// connection the server's keepalives as startup parameters, so the server
// ends a vanished client's session and releases what it held. A pooler
// gets none of those parameters: PgBouncer refuses one it does not know,
// and the server's client there is the pooler. An idle connection the pool
// hands out is pinged within a second (unless the URL sets
// pool_ping_timeout), so connections a fault left dead are replaced
// without each costing a call its whole bound.
func NewPool(ctx context.Context, db config.Database, appName string, logger *zap.Logger) (*pgxpool.Pool, []prometheus.Collector, error) {
	cfg, err := pgxpool.ParseConfig(db.DatabaseURL)
	if err != nil {
		// pgx's error may echo the URL; never print the password.
		return nil, nil, errors.New("cannot parse the connection URL")
	}
	refusals := dbcred.NewRefusals(logger)
	collectors := []prometheus.Collector{refusals.Collector()}
	if db.PasswordFile != "" {
		cred := dbcred.NewFile(db.PasswordFile, db.UserFile, logger)
		cfg.BeforeConnect = cred.BeforeConnect
		collectors = append(collectors, cred.Collector())
	}
	if _, ok := cfg.ConnConfig.RuntimeParams["application_name"]; !ok {
		cfg.ConnConfig.RuntimeParams["application_name"] = appName
	}
	timeout := db.Timeout
	if timeout <= 0 {
		timeout = config.DatabaseDefaults().Timeout
	}
	// No server settings as startup parameters, even with --pooler none:
	// a deployment that reaches PgBouncer without saying so would stop
	// connecting (PgBouncer refuses a startup parameter it does not know).
	// The sessions that hold something across statements set the server's
	// keepalives themselves (the enqueuer's listener and polling-lock
	// sessions); a pool connection's row locks last one bounded
	// transaction, which the client's deadline ends.
	dbcall.Connections(&cfg.ConnConfig.Config, timeout)
	if cfg.PingTimeout <= 0 {
		cfg.PingTimeout = min(idlePingTimeout, timeout)
	}
	tracer := &multitracer.Tracer{ConnectTracers: []pgx.ConnectTracer{refusals}}
	if db.Pooler == config.PoolerTransaction {
		cfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeCacheDescribe
	} else if logger != nil {
		tracer.QueryTracers = []pgx.QueryTracer{&poolerMismatch{logger: logger}}
	}
	cfg.ConnConfig.Tracer = tracer
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, nil, fmt.Errorf("new pool: %w", err)
	}
	return pool, collectors, nil
}

// idlePingTimeout bounds the ping of an idle connection the pool is about
// to hand out: a round trip with nothing to do, so a second means the
// connection is dead, and it is replaced.
const idlePingTimeout = time.Second

// Service is what a long-running command runs until SIGTERM.
type Service interface {
	Start(context.Context) error
	Stop(context.Context) error
}

// RunService starts svc, waits for ctx to be cancelled, then stops it
// within timeout. It is the body of every long-running command.
func RunService(ctx context.Context, svc Service, timeout time.Duration) error {
	return RunServices(ctx, timeout, svc)
}

// RunServices is RunService for services that run side by side: they
// start in order and stop in reverse order, so one started first (an
// exporter whose gauges should cover the others' whole life) stops last.
// All the stops share one timeout, the command's --shutdown-timeout. If a
// Start fails, the services already started are stopped, within timeout.
func RunServices(ctx context.Context, timeout time.Duration, svcs ...Service) error {
	var err error
	started := 0
	for _, svc := range svcs {
		if err = svc.Start(ctx); err != nil {
			break
		}
		started++
	}
	if err == nil {
		<-ctx.Done()
	}
	// The stops keep ctx's values, not its cancellation.
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), timeout)
	defer cancel()
	for i := started - 1; i >= 0; i-- {
		err = errors.Join(err, svcs[i].Stop(sctx))
	}
	return err
}
