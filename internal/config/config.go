// Package config parses a command's flags and IDEMD_-prefixed environment
// with kong, and reports every configuration problem at once rather than the
// first one, so an operator fixes a bad Deployment in one round trip.
package config

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"reflect"
	"regexp"
	"slices"
	"strconv"
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
	DatabaseURL string `name:"database-url" env:"DATABASE_URL" help:"PostgreSQL connection URL (env DATABASE_URL). ${database_url_need=Required.}"`
	// PasswordFile is read again for every new connection (internal/dbcred):
	// a password or token that something else rotates.
	PasswordFile string `name:"database-password-file" help:"File holding the database password or token (a Vault agent's, an RDS IAM or Cloud SQL token sidecar's, a mounted Secret's), read again for every new connection and used instead of the URL's password; a trailing line break is ignored. Set pool_max_conn_lifetime in the URL below the token's lifetime (docs/operations.md)."`
	// UserFile, read with the password at each new connection, lets a
	// rotation change the role too (two roles in turn, Vault's dynamic
	// roles): the one rotation that never refuses a new connection.
	UserFile string `name:"database-user-file" help:"File holding the database user, read with --database-password-file for every new connection and used instead of the URL's user: for credentials that change role at each rotation (Vault dynamic roles, two roles used in turn, docs/operations.md). Needs --database-password-file."`
	Pooler   string `name:"pooler" default:"none" help:"What --database-url goes through: none (direct), session (a session-mode pooler) or transaction (PgBouncer's transaction mode, or any proxy that moves a client between server connections). transaction turns off pgx's named prepared statements, which such a pooler cannot keep (docs/operations.md)."`
	// Timeout bounds every database call that has no timeout of its own
	// (internal/dbcall), so a silent fault costs a failed call, not a
	// daemon blocked for minutes.
	Timeout time.Duration `name:"database-timeout" default:"${database_timeout}" help:"The longest any database call may take where no timeout of its own applies (acquiring a connection, BEGIN, COMMIT, an enqueuer batch, a lease renewal, a low-water mark, a stats query), and each new connection's connect_timeout when the URL sets none. A call that runs out fails and is retried on a new connection, so a black-holed network or a frozen server costs seconds, not minutes (docs/operations.md)."`
}

// DatabaseDefaults are the defaults of Database's flags that are not
// written in their tags. The database timeout: ten times an enqueuer
// batch's p99 at the sizes docs/operations.md recommends (about a
// second), so a slow moment never fails a healthy call, and short enough
// that a daemon is moving again within seconds of a silent fault's end.
func DatabaseDefaults() Database {
	return Database{Timeout: 10 * time.Second}
}

// Check returns the problems with the database setting.
func (d *Database) Check() []string {
	var p []string
	if strings.TrimSpace(d.DatabaseURL) == "" {
		p = append(p, "--database-url (or DATABASE_URL) is required")
	}
	if d.UserFile != "" && d.PasswordFile == "" {
		p = append(p, "--database-user-file needs --database-password-file: a user read from a file has no password in the URL")
	}
	if !slices.Contains(Poolers, d.Pooler) {
		p = append(p, fmt.Sprintf("--pooler %q must be one of %s", d.Pooler, strings.Join(Poolers, ", ")))
	}
	if d.Timeout <= 0 {
		p = append(p, "--database-timeout must be positive")
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
	HTTPAddr        string        `name:"http-addr" default:":9090" help:"Address for /healthz, /readyz and /metrics; empty disables the server. A one-shot run (--once, --dry-run, a reaper without --schedule) serves them only when this is given explicitly."`
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

// Given reports whether the flag name (without --) was set explicitly for
// the run kctx parsed: on the command line or by its environment variable,
// rather than left at its default.
func Given(kctx *kong.Context, name string) bool {
	if kctx == nil {
		return false
	}
	for _, p := range kctx.Path {
		if p.Flag != nil && p.Flag.Name == name {
			return true
		}
	}
	for _, f := range kctx.Flags() {
		if f.Name != name {
			continue
		}
		for _, env := range f.Tag.Envs {
			if _, ok := os.LookupEnv(env); ok {
				return true
			}
		}
	}
	return false
}

// DatabaseSometimes is implemented by a CLI some of whose commands run
// without a database: --help then says which need --database-url instead
// of calling it required for all (a flag's help ends with "Required." only
// when every command it appears under requires it).
type DatabaseSometimes interface {
	DatabaseNeed() string
}

// Checker is implemented by a command's CLI struct to report its problems.
type Checker interface {
	Check() []string
}

// Error is a configuration or usage error: the command exits 2.
type Error struct {
	Problems []string
}

// Problems is the error for a list of configuration problems: nil when
// there are none, else an *Error (exit 2) listing every one.
func Problems(p []string) error {
	if len(p) == 0 {
		return nil
	}
	return &Error{Problems: p}
}

func (e *Error) Error() string {
	return "invalid configuration:\n  - " + strings.Join(e.Problems, "\n  - ")
}

// ErrHelp is returned when --help was printed; the command exits 0.
var ErrHelp = errors.New("help printed")

// Parse parses args (without the program name) into cli and reports every
// configuration problem at once, each bad value once:
//
//   - a value that does not decode (a non-number, a bad duration, a word
//     outside an enum) is one problem naming where it came from, the flag
//     or its environment variable (IDEMD_BATCH_SIZE=abc names
//     IDEMD_BATCH_SIZE), and the parse goes on to find the others;
//   - cli's Check then runs (and a subcommand's Validate, inside kong),
//     but their problems that name a flag whose value did not decode are
//     dropped: that flag holds no value to judge (--batch-size=abc would
//     otherwise also be "got 0");
//   - a negative number is a value where a number or duration is expected:
//     --rate -1 and --rate=-1 both set -1 (which Check may then refuse).
func Parse(name, description string, cli any, args []string, stdout io.Writer, extra ...kong.Option) (*kong.Context, error) {
	st := &parseState{}
	helpPrinted := false
	opts, err := modelOptions(cli)
	if err != nil {
		return nil, err
	}
	opts = append(opts,
		kong.Name(name),
		kong.Description(description),
		kong.Writers(stdout, stdout),
		kong.Exit(func(int) { helpPrinted = true }),
		kong.UsageOnError(),
		kong.ConfigureHelp(kong.HelpOptions{Compact: true}),
		// The command line has been read; what decodes from here on comes
		// from the environment (or a default).
		kong.WithBeforeReset(func() error { st.fromEnv = true; return nil }),
	)
	for typ, decode := range decoders {
		opts = append(opts, kong.TypeMapper(typ, collecting{decode: decode, st: st}))
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
	if kctx == nil {
		var perr *kong.ParseError
		if errors.As(err, &perr) {
			kctx = perr.Context
		}
	}
	problems, failed := st.report(kctx)
	// A command's own Validate runs inside kong's parse; its complaint
	// about a flag that did not decode is dropped like Check's.
	if err != nil && !namesAny(err.Error(), failed) {
		problems = append(problems, unknownCommand(kctx, err))
	}
	// After a kong error (an unknown flag, say) nothing was applied: Check
	// would judge zero values.
	if c, ok := cli.(Checker); ok && err == nil {
		for _, p := range c.Check() {
			if !namesAny(p, failed) {
				problems = append(problems, p)
			}
		}
	}
	if len(problems) > 0 {
		return kctx, &Error{Problems: problems}
	}
	return kctx, nil
}

// unknownCommand words kong's "unexpected argument bogus" where a command
// was expected as what it is, with the commands there are: an operator who
// mistyped one learns the right name without another round trip.
func unknownCommand(kctx *kong.Context, err error) string {
	word, ok := strings.CutPrefix(err.Error(), "unexpected argument ")
	if !ok || kctx == nil || kctx.Model == nil {
		return err.Error()
	}
	// kong's suggestion for a near miss: `shwo, did you mean "show"?`.
	word, suggestion, _ := strings.Cut(word, ", did you mean ")
	if suggestion != "" {
		suggestion = " (did you mean " + strings.TrimSuffix(suggestion, "?") + "?)"
	}
	node := kctx.Model.Node
	for _, p := range kctx.Path {
		if p.Command != nil {
			node = p.Command
		}
	}
	if len(node.Positional) > 0 {
		return err.Error() // a command with arguments got one too many
	}
	var names []string
	for _, c := range node.Children {
		if !c.Hidden {
			names = append(names, c.Name)
		}
	}
	if len(names) == 0 {
		return err.Error()
	}
	return fmt.Sprintf("unknown command %q for %q%s; the commands are: %s (%s --help describes each)",
		word, node.FullPath(), suggestion, strings.Join(names, ", "), node.FullPath())
}

// modelOptions are the options that shape cli's model (which flags exist,
// which environment variables each reads, their defaults): Parse's and
// Model's, so a test of the model tests what Parse parses.
func modelOptions(cli any) ([]kong.Option, error) {
	opts := []kong.Option{kong.DefaultEnvars(EnvPrefix),
		kong.Vars{"database_timeout": FormatDuration(DatabaseDefaults().Timeout)}}
	if d, ok := cli.(DatabaseSometimes); ok {
		opts = append(opts, kong.Vars{"database_url_need": d.DatabaseNeed()})
	}
	if d, ok := cli.(Defaulter); ok {
		vars, err := Vars(d.FlagDefaults())
		if err != nil {
			return nil, err
		}
		opts = append(opts, vars)
	}
	return opts, nil
}

// Model is cli's command model as Parse builds it, for tests that check a
// rule over every command (say, which flags read the environment).
func Model(name string, cli any, extra ...kong.Option) (*kong.Application, error) {
	opts, err := modelOptions(cli)
	if err != nil {
		return nil, err
	}
	k, err := kong.New(cli, append(append(opts, kong.Name(name)), extra...)...)
	if err != nil {
		return nil, fmt.Errorf("config: build model: %w", err)
	}
	return k.Model, nil
}

// parseState is what the decoders of one Parse share.
type parseState struct {
	fromEnv  bool                 // past the command line: env and defaults
	given    map[*kong.Value]bool // values given on the command line
	problems []problem
}

// problem is a value that did not decode.
type problem struct {
	value *kong.Value
	text  string
}

// report returns the problems of the values kctx selected (an environment
// variable meant for another idemctl subcommand is not this one's problem)
// and the names of their flags.
func (st *parseState) report(kctx *kong.Context) ([]string, []string) {
	selected := map[*kong.Value]bool{}
	if kctx != nil {
		for _, p := range kctx.Path {
			if n := p.Node(); n != nil {
				for _, v := range n.Values() {
					selected[v] = true
				}
			}
		}
	}
	var texts, failed []string
	for _, p := range st.problems {
		if kctx != nil && !selected[p.value] {
			continue
		}
		texts = append(texts, p.text)
		failed = append(failed, argName(p.value))
	}
	return texts, failed
}

// argName is a value as the user typed it and --help shows it: --name for
// a flag, <name> for a positional argument (which has no "--" spelling).
func argName(v *kong.Value) string {
	if v.Flag == nil {
		return "<" + v.Name + ">"
	}
	return "--" + v.Name
}

// namesAny reports whether the problem text mentions any of names (each
// --flag or <arg>), as a whole name.
func namesAny(text string, names []string) bool {
	for _, flag := range names {
		for i := strings.Index(text, flag); i >= 0; {
			end := i + len(flag)
			if end == len(text) || !isFlagChar(text[end]) {
				return true
			}
			next := strings.Index(text[end:], flag)
			if next < 0 {
				break
			}
			i = end + next
		}
	}
	return false
}

func isFlagChar(c byte) bool {
	return c == '-' || c >= 'a' && c <= 'z' || c >= '0' && c <= '9'
}

// decoders turn one value's text into a field, saying in words what was
// expected. Every flag of these types (and every string flag with an
// enum) goes through collecting.
var decoders = map[reflect.Type]func(s string, v *kong.Value, target reflect.Value) error{
	reflect.TypeOf(time.Duration(0)): func(s string, _ *kong.Value, target reflect.Value) error {
		d, err := time.ParseDuration(s)
		if err != nil {
			return fmt.Errorf("%q is not a duration (a number with a unit: 500ms, 90s, 15m, 72h)", s)
		}
		target.SetInt(int64(d))
		return nil
	},
	reflect.TypeOf(int(0)):   decodeInt,
	reflect.TypeOf(int64(0)): decodeInt,
	reflect.TypeOf(float64(0)): func(s string, _ *kong.Value, target reflect.Value) error {
		f, err := strconv.ParseFloat(s, 64)
		if err != nil {
			return fmt.Errorf("%q is not a number", s)
		}
		target.SetFloat(f)
		return nil
	},
	reflect.TypeOf(""): func(s string, v *kong.Value, target reflect.Value) error {
		if v != nil && v.Enum != "" {
			if enum := v.EnumSlice(); !slices.Contains(enum, s) {
				// kong checks enums after the parse and stops at the
				// first; this reports every one. A value kong's check
				// accepts stands in: Parse fails on this problem anyway.
				target.SetString(enum[0])
				if v.HasDefault {
					target.SetString(v.Default)
				}
				return fmt.Errorf("%q is not one of %s", s, strings.Join(enum, ", "))
			}
		}
		target.SetString(s)
		return nil
	},
}

func decodeInt(s string, _ *kong.Value, target reflect.Value) error {
	n, err := strconv.ParseInt(s, 0, target.Type().Bits())
	if err != nil {
		if errors.Is(err, strconv.ErrRange) {
			return fmt.Errorf("%q is out of range", s)
		}
		return fmt.Errorf("%q is not a whole number", s)
	}
	target.SetInt(n)
	return nil
}

// negativeNumber is a command-line word that reads as a value although it
// starts with a hyphen: -1, -0.5, -.5, -1s.
var negativeNumber = regexp.MustCompile(`^-\.?[0-9]`)

// collecting decodes a value with decode, records a failure as a problem
// instead of aborting the parse, and takes a negative number after a flag
// as the flag's value (kong would read -1 as the short flag -1).
type collecting struct {
	decode func(s string, v *kong.Value, target reflect.Value) error
	st     *parseState
}

func (c collecting) Decode(ctx *kong.DecodeContext, target reflect.Value) error {
	if tok := ctx.Scan.Peek(); tok.Type == kong.UntypedToken {
		if s, ok := tok.Value.(string); ok && negativeNumber.MatchString(s) {
			ctx.Scan.Pop()
			ctx.Scan.PushTyped(s, kong.FlagValueToken)
		}
	}
	tok, err := ctx.Scan.PopValue("value")
	if err != nil {
		return err // kong's own message: a flag where its value should be
	}
	s, ok := tok.Value.(string)
	if !ok {
		s = fmt.Sprint(tok.Value)
	}
	v := ctx.Value
	if v == nil {
		return c.decode(s, nil, target)
	}
	if !c.st.fromEnv {
		if c.st.given == nil {
			c.st.given = map[*kong.Value]bool{}
		}
		c.st.given[v] = true
	}
	if err := c.decode(s, v, target); err != nil {
		c.st.record(v, s, err)
	}
	return nil
}

// record words a decode failure by its source: the flag, or the
// environment variable kong read it from, or the default.
func (st *parseState) record(v *kong.Value, s string, err error) {
	flag := argName(v)
	if !st.fromEnv {
		st.problems = append(st.problems, problem{v, fmt.Sprintf("%s: %v", flag, err)})
		return
	}
	if st.given[v] {
		return // the command line overrides it
	}
	for _, env := range v.Tag.Envs {
		if val, ok := os.LookupEnv(env); ok && val == s {
			st.problems = append(st.problems, problem{v, fmt.Sprintf("%s (%s): %v", env, flag, err)})
			return
		}
	}
	st.problems = append(st.problems, problem{v, fmt.Sprintf("%s: default: %v", flag, err)})
}
