// Package system runs idemd the way it is deployed, for the end-to-end fault
// suite (internal/testing/e2e), the load run (internal/testing/e2e/load) and
// the soak (internal/testing/e2e/soak): it builds the
// real binaries, creates and migrates a database with `idemctl migrate`,
// starts Rocket Rides (API, fake Stripe, receipt worker) and the daemons as
// processes, and keeps count of every process exit it did not cause.
package system

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemd/idemd/examples/rocketrides/api"
	"github.com/idemd/idemd/examples/rocketrides/fakestripe"
	"github.com/idemd/idemd/internal/testing/dbtest"
	"github.com/idemd/idemd/internal/testing/scratchdb"
)

// Binaries are the built commands.
type Binaries struct {
	Enqueuer, Completer, Reaper, Idemctl, RocketRides string
}

// ModuleRoot is the directory of idemd's go.mod, found with `go env GOMOD`
// from the working directory (tests and `go run` both run inside the module).
func ModuleRoot(ctx context.Context) (string, error) {
	out, err := exec.CommandContext(ctx, "go", "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOMOD: %w", err)
	}
	mod := strings.TrimSpace(string(out))
	if mod == "" || mod == os.DevNull {
		return "", errors.New("not inside the idemd module (go env GOMOD is empty)")
	}
	return filepath.Dir(mod), nil
}

// Build compiles the daemons, idemctl and the rocketrides server into dir.
func Build(ctx context.Context, dir string) (*Binaries, error) {
	return BuildTags(ctx, dir)
}

// BuildTags is Build with build tags (the soak's idemd_short_retention).
func BuildTags(ctx context.Context, dir string, tags ...string) (*Binaries, error) {
	root, err := ModuleRoot(ctx)
	if err != nil {
		return nil, err
	}
	args := []string{"build", "-o", dir + string(filepath.Separator)}
	if len(tags) > 0 {
		args = append(args, "-tags", strings.Join(tags, ","))
	}
	args = append(args, "./cmd/enqueuer", "./cmd/completer", "./cmd/reaper", "./cmd/idemctl", "./examples/rocketrides/cmd/rocketrides")
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("go build: %w\n%s", err, out)
	}
	return &Binaries{
		Enqueuer: filepath.Join(dir, "enqueuer"), Completer: filepath.Join(dir, "completer"),
		Reaper: filepath.Join(dir, "reaper"), Idemctl: filepath.Join(dir, "idemctl"),
		RocketRides: filepath.Join(dir, "rocketrides"),
	}, nil
}

// FreeAddr returns 127.0.0.1:<a port that was free a moment ago>.
func FreeAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", fmt.Errorf("free port: %w", err)
	}
	defer l.Close()
	return l.Addr().String(), nil
}

// Migrate runs `idemctl migrate` against dbURL: the rollout's migration Job.
func Migrate(ctx context.Context, bins *Binaries, dbURL string) error {
	cmd := exec.CommandContext(ctx, bins.Idemctl, "migrate", "--database-url", dbURL, "--log-format", "console")
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("idemctl migrate: %w\n%s", err, out)
	}
	return nil
}

// Exit is one process exit.
type Exit struct {
	Proc string
	Code int
	At   time.Time
}

func (e Exit) String() string {
	return fmt.Sprintf("%s exited %d at %s", e.Proc, e.Code, e.At.Format("15:04:05.000"))
}

// Proc is one daemon process that a test may SIGKILL and start again. Every
// exit the Proc did not cause itself (Kill, Stop) is recorded as
// unexpected: that is how the suite tells a restart loop from its own
// faults.
type Proc struct {
	Name    string
	Bin     string
	Args    []string
	Env     []string
	LogPath string
	// OpsAddr is host:port of /healthz and /readyz ("" when none).
	OpsAddr string

	mu         sync.Mutex
	cmd        *exec.Cmd
	done       chan struct{}
	expected   bool
	lastCode   int
	starts     int
	kills      int
	unexpected []Exit
	log        *os.File
}

// Pid is the running process's id, 0 when it is not running.
func (p *Proc) Pid() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil || p.cmd.Process == nil {
		return 0
	}
	return p.cmd.Process.Pid
}

// Start starts the process (again). Output is appended to LogPath.
func (p *Proc) Start() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd != nil {
		return fmt.Errorf("%s: already running", p.Name)
	}
	if p.log == nil {
		f, err := os.OpenFile(p.LogPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		if err != nil {
			return fmt.Errorf("%s: log file: %w", p.Name, err)
		}
		p.log = f
	}
	fmt.Fprintf(p.log, "=== start %d at %s\n", p.starts+1, time.Now().Format("15:04:05.000"))
	cmd := exec.Command(p.Bin, p.Args...)
	cmd.Env = append(harnessFreeEnv(os.Environ()), p.Env...)
	cmd.Stdout, cmd.Stderr = p.log, p.log
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("%s: start: %w", p.Name, err)
	}
	p.cmd, p.done, p.expected = cmd, make(chan struct{}), false
	p.starts++
	go p.wait(cmd, p.done)
	return nil
}

func (p *Proc) wait(cmd *exec.Cmd, done chan struct{}) {
	err := cmd.Wait()
	code := 0
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		code = ee.ExitCode() // -1 when killed by a signal
	} else if err != nil {
		code = -2
	}
	p.mu.Lock()
	if !p.expected {
		p.unexpected = append(p.unexpected, Exit{Proc: p.Name, Code: code, At: time.Now()})
	}
	p.lastCode = code
	p.cmd = nil
	p.mu.Unlock()
	close(done)
}

// Running reports whether the process is alive.
func (p *Proc) Running() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cmd != nil
}

func (p *Proc) signal(sig syscall.Signal) (chan struct{}, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil {
		return nil, fmt.Errorf("%s: not running", p.Name)
	}
	p.expected = true
	if sig == syscall.SIGKILL {
		p.kills++
	}
	if err := p.cmd.Process.Signal(sig); err != nil {
		return nil, fmt.Errorf("%s: signal: %w", p.Name, err)
	}
	return p.done, nil
}

// Kill sends SIGKILL and waits for the process to be gone.
func (p *Proc) Kill() error {
	done, err := p.signal(syscall.SIGKILL)
	if err != nil {
		return err
	}
	<-done
	return nil
}

// Dump sends SIGQUIT, on which a Go program writes every goroutine's stack
// to its log and exits, and waits for the process to be gone (killing it
// if it outlives timeout): the record of where a stuck daemon is stuck. It
// returns the log's offset where the dump starts. The exit is the
// harness's doing.
func (p *Proc) Dump(timeout time.Duration) (int64, error) {
	var from int64
	if st, err := os.Stat(p.LogPath); err == nil {
		from = st.Size()
	}
	done, err := p.signal(syscall.SIGQUIT)
	if err != nil {
		return from, err
	}
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-done:
		return from, nil
	case <-t.C:
		_ = p.Kill()
		return from, fmt.Errorf("%s: still running %s after SIGQUIT", p.Name, timeout)
	}
}

// Stop sends SIGTERM and returns the exit code, killing the process if it
// outlives timeout (an error then).
func (p *Proc) Stop(timeout time.Duration) (int, error) {
	done, err := p.signal(syscall.SIGTERM)
	if err != nil {
		return 0, err
	}
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
		_ = p.Kill()
		return -1, fmt.Errorf("%s: still running %s after SIGTERM", p.Name, timeout)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.lastCode, nil
}

// Wait waits for a process that ends by itself (a --once run) and returns
// its exit code. Such an exit is not counted as unexpected.
func (p *Proc) Wait(ctx context.Context) (int, error) {
	p.mu.Lock()
	done := p.done
	p.expected = true
	p.mu.Unlock()
	if done == nil {
		return 0, fmt.Errorf("%s: never started", p.Name)
	}
	select {
	case <-done:
	case <-ctx.Done():
		return 0, fmt.Errorf("%s: %w", p.Name, ctx.Err())
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.lastCode, nil
}

// Counts returns how often the process was started and SIGKILLed by the
// harness, and the exits it did not cause.
func (p *Proc) Counts() (starts, kills int, unexpected []Exit) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.starts, p.kills, append([]Exit(nil), p.unexpected...)
}

// Close kills the process if it still runs and closes its log.
func (p *Proc) Close() {
	if p.Running() {
		_ = p.Kill()
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.log != nil {
		p.log.Close()
		p.log = nil
	}
}

// LogTail returns the last n bytes of the log, for a failing test.
func (p *Proc) LogTail(n int64) string {
	f, err := os.Open(p.LogPath)
	if err != nil {
		return err.Error()
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return err.Error()
	}
	if st.Size() > n {
		_, _ = f.Seek(st.Size()-n, io.SeekStart)
	}
	b, _ := io.ReadAll(f)
	return string(b)
}

// httpClient is short-timeout: every call here is a probe or an admin call.
var httpClient = &http.Client{Timeout: 5 * time.Second}

// recordsClient reads the fake Stripe's records: after a soak they are
// hundreds of thousands of charges, more than a probe's timeout reads.
var recordsClient = &http.Client{Timeout: 2 * time.Minute}

// CloseIdleConnections releases the probes' keep-alive connections (goleak).
func CloseIdleConnections() {
	httpClient.CloseIdleConnections()
	recordsClient.CloseIdleConnections()
}

// Ready asks /readyz: true for 200, false with the body otherwise (and
// false with the error when the process does not answer).
func (p *Proc) Ready(ctx context.Context) (bool, string) {
	return get200(ctx, "http://"+p.OpsAddr+"/readyz")
}

// Metrics returns the process's /metrics page.
func (p *Proc) Metrics(ctx context.Context) ([]byte, error) {
	status, b, err := fetch(ctx, "http://"+p.OpsAddr+"/metrics", 16<<20)
	if err != nil {
		return nil, err
	}
	if status != http.StatusOK {
		return nil, fmt.Errorf("%s /metrics: status %d", p.Name, status)
	}
	return b, nil
}

func get200(ctx context.Context, u string) (bool, string) {
	status, b, err := fetch(ctx, u, 4096)
	if status == 0 {
		// No answer; a body cut short still has its status.
		return false, err.Error()
	}
	return status == http.StatusOK, strings.TrimSpace(string(b))
}

// fetch GETs u and returns its status and up to limit bytes of its body.
func fetch(ctx context.Context, u string, limit int64) (int, []byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return 0, nil, err
	}
	resp, err := httpClient.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, limit))
	return resp.StatusCode, b, err
}

// Poll calls cond every interval until it returns true or ctx ends.
func Poll(ctx context.Context, interval time.Duration, cond func() (bool, error)) error {
	t := time.NewTicker(interval)
	defer t.Stop()
	var last error
	for {
		ok, err := cond()
		if ok {
			return nil
		}
		if err != nil {
			last = err
		}
		select {
		case <-ctx.Done():
			if last != nil {
				return fmt.Errorf("%w (last error: %w)", ctx.Err(), last)
			}
			return ctx.Err()
		case <-t.C:
		}
	}
}

// RocketRides is the reference API process: API, fake Stripe (with its
// /_fake/charges oracle), the fault switch and the receipt worker.
type RocketRides struct {
	*Proc
	APIURL, AdminURL, StripeURL string
}

// RocketRidesOptions configures StartRocketRides.
type RocketRidesOptions struct {
	DatabaseURL   string
	SecretFile    string // replay secret; the completer signs with it
	StripeLatency time.Duration
	Dir           string // for the log
	// ExtraArgs are appended to the server's flags (--receipt-workers).
	ExtraArgs []string
}

// StartRocketRides starts the rocketrides server on free ports and waits
// until its API answers.
func StartRocketRides(ctx context.Context, bins *Binaries, o RocketRidesOptions) (*RocketRides, error) {
	var addrs [4]string
	for i := range addrs {
		a, err := FreeAddr()
		if err != nil {
			return nil, err
		}
		addrs[i] = a
	}
	rr := &RocketRides{
		Proc: &Proc{
			Name: "rocketrides", Bin: bins.RocketRides, LogPath: filepath.Join(o.Dir, "rocketrides.log"), OpsAddr: addrs[3],
			Args: []string{
				"--database-url", o.DatabaseURL, "--log-format", "console", "--log-level", "warn",
				"--addr", addrs[0], "--admin-addr", addrs[1], "--stripe-addr", addrs[2], "--http-addr", addrs[3],
				"--replay-secret-file", o.SecretFile, "--stripe-latency", o.StripeLatency.String(),
			},
		},
		APIURL: "http://" + addrs[0], AdminURL: "http://" + addrs[1], StripeURL: "http://" + addrs[2],
	}
	rr.Args = append(rr.Args, o.ExtraArgs...)
	if err := rr.Start(); err != nil {
		return nil, err
	}
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := Poll(wctx, 50*time.Millisecond, func() (bool, error) {
		if !rr.Running() {
			return false, errors.New("rocketrides exited")
		}
		ok, _ := get200(wctx, rr.APIURL+"/healthz")
		return ok, nil
	}); err != nil {
		rr.Close()
		return nil, fmt.Errorf("rocketrides did not come up: %w\n%s", err, rr.LogTail(4000))
	}
	return rr, nil
}

// SetFaults replaces the API's fault rules (PUT /faults on the admin port).
func (rr *RocketRides) SetFaults(ctx context.Context, rules ...api.FaultRule) error {
	if rules == nil {
		rules = []api.FaultRule{}
	}
	b, err := json.Marshal(rules)
	if err != nil {
		return fmt.Errorf("faults: %w", err)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPut, rr.AdminURL+"/faults", bytes.NewReader(b))
	if err != nil {
		return fmt.Errorf("faults: %w", err)
	}
	resp, err := httpClient.Do(req)
	if err != nil {
		return fmt.Errorf("faults: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(resp.Body)
		return fmt.Errorf("faults: %s: %s", resp.Status, body)
	}
	return nil
}

// Charges returns every charge the fake Stripe created (GET /_fake/charges).
func (rr *RocketRides) Charges(ctx context.Context) ([]fakestripe.Charge, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, rr.StripeURL+"/_fake/charges", nil)
	if err != nil {
		return nil, fmt.Errorf("charges: %w", err)
	}
	resp, err := recordsClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("charges: %w", err)
	}
	defer resp.Body.Close()
	var out []fakestripe.Charge
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		return nil, fmt.Errorf("charges: decode: %w", err)
	}
	return out, nil
}

// Riders creates n riders (the first declines of them with a card that is
// always declined) and returns their API keys.
func Riders(ctx context.Context, pool *pgxpool.Pool, n, declines int) ([]string, error) {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	run := hex.EncodeToString(b)
	var keys []string
	for i := range n {
		customer := fmt.Sprintf("cus_e2e_%s_%d", run, i)
		if i < declines {
			customer = fmt.Sprintf("%s_e2e_%s_%d", fakestripe.DeclinePrefix, run, i)
		}
		key := fmt.Sprintf("sk_e2e_%s_%d", run, i)
		if _, err := api.CreateUser(ctx, pool, fmt.Sprintf("e2e-%s-%d@example.com", run, i), customer, key); err != nil {
			return nil, err
		}
		keys = append(keys, key)
	}
	return keys, nil
}

// WriteSecret writes a fresh 32-byte replay secret (hex) to dir/name.
func WriteSecret(dir, name string) (string, []byte, error) {
	b := make([]byte, 32)
	_, _ = rand.Read(b)
	s := []byte(hex.EncodeToString(b))
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, s, 0o600); err != nil {
		return "", nil, fmt.Errorf("write secret: %w", err)
	}
	return path, s, nil
}

// DaemonSet is the idemd deployment of the suite: its enqueuers, completers
// and reaper, each a Proc.
type DaemonSet struct {
	Enqueuers, Completers []*Proc
	Reaper                *Proc
}

// All returns every Proc.
func (d *DaemonSet) All() []*Proc {
	out := append(append([]*Proc(nil), d.Enqueuers...), d.Completers...)
	if d.Reaper != nil {
		out = append(out, d.Reaper)
	}
	return out
}

// DaemonOptions are the flags the suite varies; the rest are the defaults
// of docs/design.md's operator contract, shortened so a run takes minutes.
type DaemonOptions struct {
	DatabaseURL string // the daemons' URL (through the TCP proxy in the fault suite)
	APIURL      string // where completers replay
	SecretFile  string
	Enqueuers   int
	Completers  int
	Reaper      bool
	Dir         string
	// ExtraCompleterArgs are appended to every completer's flags.
	ExtraCompleterArgs []string
	// ExtraArgs are appended to every daemon's flags (--pooler), and
	// ExtraEnqueuerArgs to the enqueuers' (--listen-database-url).
	ExtraArgs         []string
	ExtraEnqueuerArgs []string
	// AtDefaults runs every daemon at its own defaults: only what has none
	// is given (the completer's --api-url and secret, the reaper's
	// --schedule, ReaperSchedule), besides what every daemon gets here
	// (the URL, the log format, --http-addr, --shutdown-timeout) and the
	// Extra args. The faults that say nothing are tried on the daemons as
	// an operator deploys them, not on the suite's shortened waits.
	AtDefaults bool
	// ReaperSchedule is the reaper's --schedule with AtDefaults (it has no
	// default: without it the reaper runs once and exits).
	ReaperSchedule string
	// ApplicationPrefix, when set, names each daemon's sessions
	// (application_name in its URL) <prefix><daemon>, e.g. a release's
	// daemons apart from another's.
	ApplicationPrefix string
	// PreviousRelease: the binaries are the previous release's, whose
	// enqueuer names its sweep interval --poll-interval (this release's
	// --sweep-interval; the old spelling still works here, with a
	// warning, for one release).
	PreviousRelease bool
}

// NewDaemons builds (does not start) the daemon set.
func NewDaemons(bins *Binaries, o DaemonOptions) (*DaemonSet, error) {
	d := &DaemonSet{}
	common := func(name string) ([]string, string, error) {
		addr, err := FreeAddr()
		if err != nil {
			return nil, "", err
		}
		dbURL := o.DatabaseURL
		if o.ApplicationPrefix != "" {
			u, err := url.Parse(dbURL)
			if err != nil {
				return nil, "", fmt.Errorf("daemon URL: %w", err)
			}
			q := u.Query()
			q.Set("application_name", o.ApplicationPrefix+name)
			u.RawQuery = q.Encode()
			dbURL = u.String()
		}
		args := []string{"--database-url", dbURL, "--log-format", "console", "--http-addr", addr, "--shutdown-timeout", "10s"}
		return append(args, o.ExtraArgs...), addr, nil
	}
	for i := range o.Enqueuers {
		name := fmt.Sprintf("enqueuer-%d", i+1)
		args, addr, err := common(name)
		if err != nil {
			return nil, err
		}
		sweep := "--sweep-interval"
		if o.PreviousRelease {
			sweep = "--poll-interval"
		}
		if !o.AtDefaults {
			args = append(args, "--allowed-kinds", "send_ride_receipt", "--max-args-bytes", "4096", sweep, "1s", "--stats-interval", "1s")
		}
		args = append(args, o.ExtraEnqueuerArgs...)
		d.Enqueuers = append(d.Enqueuers, &Proc{Name: name, Bin: bins.Enqueuer, Args: args, OpsAddr: addr, LogPath: filepath.Join(o.Dir, name+".log")})
	}
	for i := range o.Completers {
		name := fmt.Sprintf("completer-%d", i+1)
		args, addr, err := common(name)
		if err != nil {
			return nil, err
		}
		args = append(args, "--api-url", o.APIURL, "--auth-secret-file", o.SecretFile)
		if !o.AtDefaults {
			// Short waits so abandoned keys are replayed within the run;
			// the lock timeout stays the API's 90 s, as the flag's help
			// demands.
			args = append(args, "--grace", "2s", "--idle", "1s", "--lease", "10s", "--request-timeout", "3s",
				"--backoff-base", "300ms", "--backoff-max", "2s", "--in-progress-delay", "500ms",
				"--poll-interval", "300ms", "--max-attempts", "40", "--rate", "100", "--burst", "20",
				"--breaker-cooldown", "200ms", "--breaker-max-cooldown", "1s")
		}
		args = append(args, o.ExtraCompleterArgs...)
		d.Completers = append(d.Completers, &Proc{Name: name, Bin: bins.Completer, Args: args, OpsAddr: addr, LogPath: filepath.Join(o.Dir, name+".log")})
	}
	if o.Reaper {
		args, addr, err := common("reaper")
		if err != nil {
			return nil, err
		}
		if o.AtDefaults {
			args = append(args, "--schedule", o.ReaperSchedule)
		} else {
			// The shortest retention the reaper accepts; the suite
			// backdates keys to give it work. A short lease: a reaper
			// SIGKILLed mid-run holds up its restarted self for at most
			// --lease-ttl.
			args = append(args, "--schedule", "@every 2s", "--retention", "1h", "--batch-size", "50", "--lock-window", "1h",
				"--lease-ttl", "6s", "--statement-timeout", "5s")
		}
		d.Reaper = &Proc{Name: "reaper", Bin: bins.Reaper, Args: args, OpsAddr: addr, LogPath: filepath.Join(o.Dir, "reaper.log")}
	}
	return d, nil
}

// Start starts every daemon.
func (d *DaemonSet) Start() error {
	for _, p := range d.All() {
		if err := p.Start(); err != nil {
			return err
		}
	}
	return nil
}

// Stop sends SIGTERM to every running daemon and returns the exit codes by
// name.
func (d *DaemonSet) Stop(timeout time.Duration) (map[string]int, error) {
	codes := map[string]int{}
	var errs []error
	for _, p := range d.All() {
		if !p.Running() {
			continue
		}
		code, err := p.Stop(timeout)
		codes[p.Name] = code
		if err != nil {
			errs = append(errs, err)
		}
	}
	return codes, errors.Join(errs...)
}

// Close kills whatever still runs.
func (d *DaemonSet) Close() {
	for _, p := range d.All() {
		p.Close()
	}
}

// CreateDatabase creates a database named after prefix on adminURL's server,
// applies deploy/sql/roles.sql as the operator does and runs idemd's
// migrations as idemd_migrator, as deployed (the daemons then connect as
// idemd_runtime). drop removes it.
func CreateDatabase(ctx context.Context, adminURL string, bins *Binaries, prefix string) (dbURL string, drop func(context.Context) error, err error) {
	dbURL, drop, err = scratchdb.Create(ctx, adminURL, prefix)
	if err != nil {
		return "", nil, err
	}
	if err := dbtest.ApplyRoles(ctx, dbURL); err != nil {
		return "", nil, errors.Join(err, drop(context.WithoutCancel(ctx)))
	}
	if err := Migrate(ctx, bins, dbtest.MigratorURL(dbURL)); err != nil {
		return "", nil, errors.Join(err, drop(context.WithoutCancel(ctx)))
	}
	return dbURL, drop, nil
}

// WaitReady waits up to a minute for p's /readyz.
func WaitReady(ctx context.Context, p *Proc) error {
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := Poll(wctx, 50*time.Millisecond, func() (bool, error) {
		if !p.Running() {
			return false, errors.New("exited")
		}
		ok, _ := p.Ready(wctx)
		return ok, nil
	}); err != nil {
		return fmt.Errorf("%s not ready: %w\n%s", p.Name, err, p.LogTail(2000))
	}
	return nil
}

// StartRetrying starts the process newProc returns and waits with up until
// it is up. The ports the processes listen on are free when chosen, not
// necessarily when the process binds them (another process of the machine
// may take one in between): a process that exits before it is up is
// replaced by a new one, on new ports, up to three times.
func StartRetrying(newProc func() (*Proc, error), up func(*Proc) error) error {
	var last error
	for range 3 {
		p, err := newProc()
		if err != nil {
			return err
		}
		if err := p.Start(); err != nil {
			return err
		}
		if last = up(p); last == nil {
			return nil
		}
		running := p.Running()
		p.Close()
		if running {
			return last // up, but not answering: not a port race
		}
	}
	return last
}

// harnessFreeEnv is environ without the variables that configure the test
// run itself (IDEMD_E2E_*, IDEMD_SOAK*): a daemon warns about any IDEMD_*
// variable it does not know, and these are the harness's, not a user's.
func harnessFreeEnv(environ []string) []string {
	out := make([]string, 0, len(environ))
	for _, kv := range environ {
		if strings.HasPrefix(kv, "IDEMD_E2E_") || strings.HasPrefix(kv, "IDEMD_SOAK") {
			continue
		}
		out = append(out, kv)
	}
	return out
}
