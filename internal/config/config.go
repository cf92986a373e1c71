// Package config parses a command's flags and IDEMD_-prefixed environment
// with kong, and reports every configuration problem at once rather than the
// first one, so an operator fixes a bad Deployment in one round trip.
package config

import (
	"errors"
	"fmt"
	"io"
	"net"
	"reflect"
	"slices"
	"strings"
	"time"

	"github.com/alecthomas/kong"
)

// EnvPrefix prefixes every flag's environment variable (IDEMD_BATCH_SIZE for
// --batch-size). DATABASE_URL is the one exception, by convention.
const EnvPrefix = "IDEMD"

// Pooler values: what sits between idemd and PostgreSQL.
const (
	PoolerNone        = "none"        // a direct connection
	PoolerSession     = "session"     // a session-mode pooler: one server connection per client connection
	PoolerTransaction = "transaction" // a transaction-mode pooler: server connections change between transactions
)

// Poolers lists the --pooler values.
var Poolers = []string{PoolerNone, PoolerSession, PoolerTransaction}

// Database is the connection setting every command shares.
type Database struct {
	DatabaseURL string `name:"database-url" env:"DATABASE_URL" help:"PostgreSQL connection URL (env DATABASE_URL). Required."`
	Pooler      string `name:"pooler" default:"none" help:"What --database-url goes through: none (direct), session (a session-mode pooler) or transaction (PgBouncer's transaction mode, or any proxy that moves a client between server connections). transaction turns off pgx's named prepared statements, which such a pooler cannot keep (docs/operations.md)."`
}

// Check returns the problems with the database setting.
func (d *Database) Check() []string {
	var p []string
	if strings.TrimSpace(d.DatabaseURL) == "" {
		p = append(p, "--database-url (or DATABASE_URL) is required")
	}
	if !slices.Contains(Poolers, d.Pooler) {
		p = append(p, fmt.Sprintf("--pooler %q must be one of %s", d.Pooler, strings.Join(Poolers, ", ")))
	}
	return p
}

// Logging selects the log encoding and level.
type Logging struct {
	LogFormat string `name:"log-format" default:"json" enum:"json,console" help:"Log encoding: json (production) or console."`
	LogLevel  string `name:"log-level" default:"info" enum:"debug,info,warn,error" help:"Minimum log level."`
}

// Common are the settings every daemon shares.
type Common struct {
	Database        `embed:""`
	Logging         `embed:""`
	HTTPAddr        string        `name:"http-addr" default:":9090" help:"Address for /healthz, /readyz and /metrics; empty disables the server."`
	ShutdownTimeout time.Duration `name:"shutdown-timeout" default:"20s" help:"On SIGTERM, how long to let the current pass finish before exiting."`
}

// Check returns the problems with the common settings.
func (c *Common) Check() []string {
	p := c.Database.Check()
	if c.HTTPAddr != "" {
		if _, _, err := net.SplitHostPort(c.HTTPAddr); err != nil {
			p = append(p, fmt.Sprintf("--http-addr %q: %v", c.HTTPAddr, err))
		}
	}
	if c.ShutdownTimeout <= 0 {
		p = append(p, "--shutdown-timeout must be positive")
	}
	return p
}

// Checker is implemented by a command's CLI struct to report its problems.
type Checker interface {
	Check() []string
}

// Error is a configuration or usage error: the command exits 2.
type Error struct {
	Problems []string
}

func (e *Error) Error() string {
	return "invalid configuration:\n  - " + strings.Join(e.Problems, "\n  - ")
}

// ErrHelp is returned when --help was printed; the command exits 0.
var ErrHelp = errors.New("help printed")

// Parse parses args (without the program name) into cli. Values that fail to
// decode (a bad duration, a non-number) are collected instead of stopping the
// parse, then cli's own Check runs, and all problems come back in one *Error.
func Parse(name, description string, cli any, args []string, stdout io.Writer, extra ...kong.Option) (*kong.Context, error) {
	var problems []string
	helpPrinted := false
	opts := []kong.Option{
		kong.Name(name),
		kong.Description(description),
		kong.DefaultEnvars(EnvPrefix),
		kong.Writers(stdout, stdout),
		kong.Exit(func(int) { helpPrinted = true }),
		kong.UsageOnError(),
		kong.ConfigureHelp(kong.HelpOptions{Compact: true}),
	}
	for _, typ := range []reflect.Type{
		reflect.TypeOf(time.Duration(0)),
		reflect.TypeOf(int(0)),
		reflect.TypeOf(int64(0)),
		reflect.TypeOf(float64(0)),
	} {
		opts = append(opts, kong.TypeMapper(typ, collecting{typ: typ, problems: &problems}))
	}
	if d, ok := cli.(Defaulter); ok {
		vars, err := Vars(d.FlagDefaults())
		if err != nil {
			return nil, err
		}
		opts = append(opts, vars)
	}
	opts = append(opts, extra...)
	parser, err := kong.New(cli, opts...)
	if err != nil {
		return nil, fmt.Errorf("config: build parser: %w", err)
	}
	kctx, err := parser.Parse(args)
	if helpPrinted {
		return nil, ErrHelp
	}
	if err != nil {
		problems = append(problems, err.Error())
	}
	if c, ok := cli.(Checker); ok && err == nil {
		problems = append(problems, c.Check()...)
	}
	if len(problems) > 0 {
		return kctx, &Error{Problems: problems}
	}
	return kctx, nil
}

// collecting wraps kong's default mapper for a type and records decode
// failures instead of aborting on the first.
type collecting struct {
	typ      reflect.Type
	problems *[]string
}

var defaults = kong.NewRegistry().RegisterDefaults()

func (c collecting) Decode(ctx *kong.DecodeContext, target reflect.Value) error {
	err := defaults.ForType(c.typ).Decode(ctx, target)
	if err != nil {
		name := "value"
		if ctx.Value != nil && ctx.Value.Flag != nil {
			name = "--" + ctx.Value.Flag.Name
		}
		*c.problems = append(*c.problems, fmt.Sprintf("%s: %v", name, err))
	}
	return nil
}
