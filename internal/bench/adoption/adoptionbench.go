// Package adoptionbench measures the completer on the article's API as an
// adopter runs it: rides_api.rb, the article's Rocket Rides on Sinatra +
// Sequel with SERIALIZABLE phases, form-encoded parameters and a 409 for
// a serialization failure, adopted as docs/languages/ruby.md says. Keys
// abandoned at each of its recovery points are drained by the real
// completer binary, once at its defaults (only --request-encoding form
// added) and once with --concurrency 1, each on a fresh database. The
// drain time comes from an SQL oracle (no unfinished key left) and the
// replays from the API's own log of signed requests, not from the
// completer's metrics.
package adoptionbench

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemd/idemd/internal/migrate"
	"github.com/idemd/idemd/internal/testing/scratchdb"
)

// Options configure Run and Drain.
type Options struct {
	// Keys is how many keys are abandoned, spread evenly over started,
	// ride_created and charge_created (default 90).
	Keys int
	// Users own the keys in turn (default 10).
	Users int
	// Root is the module's root (default: found upwards from the working
	// directory).
	Root string
	// Ruby is the interpreter (default: ruby on PATH).
	Ruby string
	// CompleterBin is the completer binary (default: built from
	// ./cmd/completer into a temporary directory).
	CompleterBin string
	// Timeout bounds one drain (default 10 minutes).
	Timeout time.Duration
	Logf    func(string, ...any)
}

func (o *Options) defaults() error {
	if o.Keys <= 0 {
		o.Keys = 90
	}
	if o.Users <= 0 {
		o.Users = 10
	}
	if o.Timeout <= 0 {
		o.Timeout = 10 * time.Minute
	}
	if o.Logf == nil {
		o.Logf = func(string, ...any) {}
	}
	if o.Ruby == "" {
		p, err := exec.LookPath("ruby")
		if err != nil {
			return fmt.Errorf("adoptionbench: ruby: %w", err)
		}
		o.Ruby = p
	}
	if o.Root == "" {
		root, err := moduleRoot()
		if err != nil {
			return err
		}
		o.Root = root
	}
	return nil
}

// Defaults are the completer's flags of the measured run: its defaults,
// and the encoding the article's form-reading API needs.
var Defaults = []string{"--request-encoding", "form"}

// Serial is the baseline: one replay at a time.
var Serial = []string{"--concurrency", "1", "--request-encoding", "form"}

// Drain is one drain of the abandoned keys.
type Drain struct {
	Args    []string
	Keys    int
	Elapsed time.Duration // from the completer's start to no unfinished key
	Replays int           // signed requests the API answered
	// Statuses counts the API's answers to the replays by status.
	Statuses map[int]int
	// The invariants, each from the API's tables.
	Finished      int // keys finished with 201
	GaveUp        int // keys the completer gave up on
	Rides         int // rides created
	Charges       int // charges in the fake Stripe's ledger
	DoubleCharged int // keys with more than one ride or charge
}

// Check returns what is wrong with d's end state, nil when every key
// finished once, with one ride and one charge, and none was given up.
func (d Drain) Check() error {
	var errs []error
	if d.Finished != d.Keys {
		errs = append(errs, fmt.Errorf("%d of %d keys finished with 201", d.Finished, d.Keys))
	}
	if d.GaveUp != 0 {
		errs = append(errs, fmt.Errorf("%d keys given up", d.GaveUp))
	}
	if d.Rides != d.Keys || d.Charges != d.Keys || d.DoubleCharged != 0 {
		errs = append(errs, fmt.Errorf("%d rides, %d charges, %d keys charged twice, want %d, %d, 0", d.Rides, d.Charges, d.DoubleCharged, d.Keys, d.Keys))
	}
	return errors.Join(errs...)
}

// Result is both drains.
type Result struct {
	Keys     int
	Defaults Drain
	Serial   Drain
}

// TimeRatio is the defaults' drain time over the serial one's.
func (r *Result) TimeRatio() float64 {
	return r.Defaults.Elapsed.Seconds() / max(r.Serial.Elapsed.Seconds(), 1e-9)
}

// ReplayRatio is the defaults' replays over the serial run's.
func (r *Result) ReplayRatio() float64 {
	return float64(r.Defaults.Replays) / float64(max(r.Serial.Replays, 1))
}

// Met is the target: at most 2× the serial time and 1.5× its replays.
func (r *Result) Met() bool { return r.TimeRatio() <= 2 && r.ReplayRatio() <= 1.5 }

// Run drains the keys with Defaults and with Serial, each on a database of
// its own, and returns both.
func Run(ctx context.Context, adminURL string, opts Options) (*Result, error) {
	if err := opts.defaults(); err != nil {
		return nil, err
	}
	if opts.CompleterBin == "" {
		dir, err := os.MkdirTemp("", "adoptionbench-")
		if err != nil {
			return nil, fmt.Errorf("adoptionbench: %w", err)
		}
		defer os.RemoveAll(dir) // a temp dir
		opts.CompleterBin = filepath.Join(dir, "completer")
		cmd := exec.CommandContext(ctx, "go", "build", "-o", opts.CompleterBin, "./cmd/completer")
		cmd.Dir = opts.Root
		if out, err := cmd.CombinedOutput(); err != nil {
			return nil, fmt.Errorf("adoptionbench: build the completer: %w\n%s", err, out)
		}
	}
	res := &Result{Keys: opts.Keys}
	var err error
	if res.Serial, err = DrainWith(ctx, adminURL, opts, Serial); err != nil {
		return nil, err
	}
	if res.Defaults, err = DrainWith(ctx, adminURL, opts, Defaults); err != nil {
		return nil, err
	}
	return res, nil
}

// DrainWith abandons opts.Keys keys on a fresh database, starts the API and
// the completer with args, and waits until no key is unfinished. It
// returns an error when the drain does not end within opts.Timeout, not
// when an invariant fails (Drain.Check).
func DrainWith(ctx context.Context, adminURL string, opts Options, args []string) (Drain, error) {
	if err := opts.defaults(); err != nil {
		return Drain{}, err
	}
	d := Drain{Args: args, Keys: opts.Keys, Statuses: map[int]int{}}
	dbURL, drop, err := scratchdb.Create(ctx, adminURL, "idemd_adoptionbench")
	if err != nil {
		return d, fmt.Errorf("adoptionbench: %w", err)
	}
	defer drop(context.WithoutCancel(ctx)) //nolint:errcheck // best effort; scratch database
	pool, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		return d, fmt.Errorf("adoptionbench: connect: %w", err)
	}
	defer pool.Close()
	if _, err := migrate.Up(ctx, pool, migrate.Options{}); err != nil {
		return d, fmt.Errorf("adoptionbench: migrate: %w", err)
	}
	if _, err := pool.Exec(ctx, apiSchema); err != nil {
		return d, fmt.Errorf("adoptionbench: API schema: %w", err)
	}
	for i, q := range abandonSQL {
		var args []any
		if i == 0 {
			args = []any{opts.Keys, opts.Users}
		}
		if _, err := pool.Exec(ctx, q, args...); err != nil {
			return d, fmt.Errorf("adoptionbench: abandon keys: %w", err)
		}
	}

	dir, err := os.MkdirTemp("", "adoptionbench-run-")
	if err != nil {
		return d, fmt.Errorf("adoptionbench: %w", err)
	}
	defer os.RemoveAll(dir) // a temp dir
	secretFile := filepath.Join(dir, "replay-secret")
	if err := os.WriteFile(secretFile, []byte(randomHex(32)), 0o600); err != nil {
		return d, fmt.Errorf("adoptionbench: secret: %w", err)
	}
	port, err := freePort()
	if err != nil {
		return d, err
	}
	apiURL := "http://127.0.0.1:" + strconv.Itoa(port)
	api, err := startProc(ctx, dir, "rides-api", opts.Ruby, []string{"-I", filepath.Join(opts.Root, "clients", "ruby", "lib"),
		filepath.Join(opts.Root, "internal", "bench", "adoption", "rides_api.rb")},
		"DATABASE_URL="+dbURL, "IDEMD_REPLAY_SECRET_FILE="+secretFile, "PORT="+strconv.Itoa(port))
	if err != nil {
		return d, err
	}
	defer api.stop()
	if err := waitHealthy(ctx, api, apiURL+"/healthz"); err != nil {
		return d, err
	}

	cargs := append([]string{"--api-url", apiURL, "--auth-secret-file", secretFile, "--database-url", dbURL,
		"--http-addr", "", "--log-format", "console"}, args...)
	start := time.Now()
	comp, err := startProc(ctx, dir, "completer", opts.CompleterBin, cargs)
	if err != nil {
		return d, err
	}
	defer comp.stop()
	deadline := start.Add(opts.Timeout)
	for {
		var left int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM idempotency_keys WHERE recovery_point <> 'finished' AND completer_gave_up_at IS NULL`).Scan(&left); err != nil {
			return d, fmt.Errorf("adoptionbench: count unfinished keys: %w", err)
		}
		if left == 0 {
			d.Elapsed = time.Since(start)
			break
		}
		if !comp.running() {
			return d, fmt.Errorf("adoptionbench: the completer exited with %d keys left: %v\n%s", left, comp.err, comp.tail())
		}
		if time.Now().After(deadline) {
			return d, fmt.Errorf("adoptionbench: %d keys left after %s\n%s", left, opts.Timeout, comp.tail())
		}
		select {
		case <-ctx.Done():
			return d, ctx.Err()
		case <-time.After(25 * time.Millisecond):
		}
	}
	comp.stop()
	api.stop()

	rows, err := pool.Query(ctx, `SELECT status, count(*) FROM adoption_replays GROUP BY status`)
	if err != nil {
		return d, fmt.Errorf("adoptionbench: replays: %w", err)
	}
	for rows.Next() {
		var status, n int
		if err := rows.Scan(&status, &n); err != nil {
			return d, fmt.Errorf("adoptionbench: replays: %w", err)
		}
		d.Statuses[status] = n
		d.Replays += n
	}
	if err := rows.Err(); err != nil {
		return d, fmt.Errorf("adoptionbench: replays: %w", err)
	}
	if err := pool.QueryRow(ctx, invariantsSQL).Scan(&d.Finished, &d.GaveUp, &d.Rides, &d.Charges, &d.DoubleCharged); err != nil {
		return d, fmt.Errorf("adoptionbench: invariants: %w", err)
	}
	opts.Logf("adoptionbench: %v: %d keys in %s, %d replays %v", args, d.Keys, d.Elapsed.Round(time.Millisecond), d.Replays, d.Statuses)
	return d, nil
}

// apiSchema is the API's own tables: the article's rides and audit
// records, the fake Stripe's ledger, and the log of replays.
const apiSchema = `
CREATE TABLE adoption_rides (
    id                 BIGSERIAL PRIMARY KEY,
    created_at         TIMESTAMPTZ NOT NULL DEFAULT now(),
    idempotency_key_id BIGINT UNIQUE REFERENCES idempotency_keys ON DELETE SET NULL,
    origin_lat         NUMERIC(13, 10) NOT NULL,
    origin_lon         NUMERIC(13, 10) NOT NULL,
    target_lat         NUMERIC(13, 10) NOT NULL,
    target_lon         NUMERIC(13, 10) NOT NULL,
    stripe_charge_id   TEXT,
    user_id            BIGINT NOT NULL
);
CREATE TABLE adoption_audit_records (
    id            BIGSERIAL PRIMARY KEY,
    action        TEXT NOT NULL,
    created_at    TIMESTAMPTZ NOT NULL DEFAULT now(),
    data          JSONB NOT NULL,
    resource_id   BIGINT NOT NULL,
    resource_type TEXT NOT NULL,
    user_id       BIGINT NOT NULL
);
CREATE TABLE adoption_stripe_charges (
    id           BIGSERIAL PRIMARY KEY,
    upstream_key TEXT NOT NULL UNIQUE,
    amount       INT NOT NULL,
    customer     TEXT NOT NULL,
    calls        INT NOT NULL DEFAULT 1
);
CREATE TABLE adoption_replays (
    id              BIGSERIAL PRIMARY KEY,
    at              TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp(),
    idempotency_key TEXT NOT NULL,
    status          INT NOT NULL
);`

// abandonSQL leaves $1 keys of $2 users as requests that died an hour ago
// at started, ride_created and charge_created in turn, locked past the
// lock timeout, with the rides and charges their committed phases made.
var abandonSQL = []string{`
INSERT INTO idempotency_keys (created_at, idempotency_key, last_run_at, locked_at, request_method,
                              request_params, request_path, recovery_point, user_id)
SELECT now() - interval '1 hour', 'abandoned-' || g, now() - interval '1 hour', now() - interval '1 hour', 'POST',
       jsonb_build_object('origin_lat', 37.7749 + g / 1000.0, 'origin_lon', -122.4194,
                          'target_lat', 37.8044, 'target_lon', -122.2712 - g / 1000.0),
       '/rides', (ARRAY['started', 'ride_created', 'charge_created'])[g % 3 + 1], g % $2 + 1
FROM generate_series(1, $1::int) g`, `
INSERT INTO adoption_rides (idempotency_key_id, user_id, origin_lat, origin_lon, target_lat, target_lon)
SELECT id, user_id, (request_params->>'origin_lat')::numeric, (request_params->>'origin_lon')::numeric,
       (request_params->>'target_lat')::numeric, (request_params->>'target_lon')::numeric
FROM idempotency_keys WHERE recovery_point <> 'started'`, `
INSERT INTO adoption_stripe_charges (upstream_key, amount, customer)
SELECT 'rocket-rides-ride-' || r.id, 2000, 'cus_' || r.user_id
FROM adoption_rides r JOIN idempotency_keys k ON k.id = r.idempotency_key_id
WHERE k.recovery_point = 'charge_created'`, `
UPDATE adoption_rides r SET stripe_charge_id = 'ch_' || c.id
FROM adoption_stripe_charges c WHERE c.upstream_key = 'rocket-rides-ride-' || r.id`,
}

// invariantsSQL reads the end state: keys finished with 201, keys given
// up, rides, charges, and keys with other than one ride and one charge.
const invariantsSQL = `
SELECT (SELECT count(*) FROM idempotency_keys WHERE recovery_point = 'finished' AND response_code = 201),
       (SELECT count(*) FROM idempotency_keys WHERE completer_gave_up_at IS NOT NULL),
       (SELECT count(*) FROM adoption_rides),
       (SELECT count(*) FROM adoption_stripe_charges),
       (SELECT count(*) FROM idempotency_keys k
        WHERE (SELECT count(*) FROM adoption_rides r WHERE r.idempotency_key_id = k.id) <> 1
           OR (SELECT count(*) FROM adoption_rides r JOIN adoption_stripe_charges c ON c.upstream_key = 'rocket-rides-ride-' || r.id
               WHERE r.idempotency_key_id = k.id AND r.stripe_charge_id = 'ch_' || c.id) <> 1)`

// proc is a process Drain started; only Drain stops it.
type proc struct {
	name string
	cmd  *exec.Cmd
	log  string
	done chan struct{}
	err  error
}

func startProc(ctx context.Context, dir, name, bin string, args []string, env ...string) (*proc, error) {
	logPath := filepath.Join(dir, name+".log")
	f, err := os.Create(logPath)
	if err != nil {
		return nil, fmt.Errorf("adoptionbench: %s log: %w", name, err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout, cmd.Stderr = f, f
	if err := cmd.Start(); err != nil {
		f.Close()
		return nil, fmt.Errorf("adoptionbench: start %s: %w", name, err)
	}
	p := &proc{name: name, cmd: cmd, log: logPath, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		f.Close()
		close(p.done)
	}()
	go func() {
		select {
		case <-ctx.Done():
			p.stop()
		case <-p.done:
		}
	}()
	return p, nil
}

func (p *proc) running() bool {
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

// stop sends SIGTERM, then SIGKILL after 10 s, and waits.
func (p *proc) stop() {
	if p.running() {
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(10 * time.Second):
			_ = p.cmd.Process.Kill()
			<-p.done
		}
	}
}

// tail is the end of the process's log, for an error.
func (p *proc) tail() string {
	b, _ := os.ReadFile(p.log)
	if len(b) > 4000 {
		b = b[len(b)-4000:]
	}
	return fmt.Sprintf("--- %s log (tail):\n%s", p.name, b)
}

func waitHealthy(ctx context.Context, p *proc, url string) error {
	deadline := time.Now().Add(60 * time.Second)
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return fmt.Errorf("adoptionbench: health request: %w", err)
		}
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		if !p.running() {
			return fmt.Errorf("adoptionbench: the API exited: %v\n%s", p.err, p.tail())
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("adoptionbench: the API did not answer within 60s\n%s", p.tail())
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("adoptionbench: free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// moduleRoot is the directory of go.mod, upwards from the working
// directory (go run and go test both start inside the module).
func moduleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", fmt.Errorf("adoptionbench: %w", err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("adoptionbench: no go.mod above the working directory")
		}
		dir = parent
	}
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
