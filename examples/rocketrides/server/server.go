// Package server runs Rocket Rides as one process for the demo: the API, the
// fake Stripe (unless a real Stripe URL is given), the receipt worker (River)
// and an admin listener for the fault switch. cmd/rocketrides is its main.
package server

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"go.uber.org/zap"

	"github.com/idemd/idemd/examples/rocketrides/api"
	"github.com/idemd/idemd/examples/rocketrides/fakestripe"
	"github.com/idemd/idemd/examples/rocketrides/receipts"
	"github.com/idemd/idemd/idem"
	"github.com/idemd/idemd/idem/replayauth"
	"github.com/idemd/idemd/internal/config"
	"github.com/idemd/idemd/internal/daemon"
	"github.com/idemd/idemd/internal/logging"
)

// Description is the command's --help summary.
const Description = "Rocket Rides: the reference API (POST /rides) with a fake Stripe and the receipt worker."

// Command is the CLI of cmd/rocketrides. Flags have IDEMD_ environment
// equivalents, like idemd's daemons.
type Command struct {
	config.Common `embed:""`

	Addr                     string        `name:"addr" default:":8080" help:"API listen address."`
	AdminAddr                string        `name:"admin-addr" default:"127.0.0.1:8081" help:"Admin listener: GET/PUT /faults. Empty disables it."`
	StripeAddr               string        `name:"stripe-addr" default:"127.0.0.1:12111" help:"Where to serve the fake Stripe (ignored with --stripe-url)."`
	StripeURL                string        `name:"stripe-url" help:"Use this Stripe instead of the built-in fake."`
	StripeKeyFile            string        `name:"stripe-key-file" help:"File holding the Stripe secret key (required with --stripe-url)."`
	StripeLatency            time.Duration `name:"stripe-latency" default:"0s" help:"Delay of each fake Stripe charge, so clients can give up mid-request."`
	ReplaySecretFile         string        `name:"replay-secret-file" help:"Secret for the completer's replay signature; empty disables the replay path."`
	ReplaySecretFilePrevious string        `name:"replay-secret-file-previous" help:"Previous replay secret, accepted during a rotation."`
	FaultAt                  string        `name:"fault-at" help:"Inject faults at: before, started, ride_created, charge_created, or empty for every point."`
	FaultRate                float64       `name:"fault-rate" default:"0" help:"Fraction of requests failed at --fault-at (0..1)."`
	FaultKind                string        `name:"fault-kind" default:"internal" enum:"internal,serialization" help:"Injected fault: internal (500) or serialization (409 after retries)."`
	Receipts                 bool          `name:"receipts" default:"true" negatable:"" help:"Run the send_ride_receipt River worker."`
	ReceiptJobs              string        `name:"receipt-jobs" default:"staged" enum:"staged,river,none" help:"How a paid ride's receipt job is created: staged (idem.StageJob, moved into River by idemd's enqueuer), river (River's InsertTx in the phase's transaction, no idemd), none (no job). river and none are the load benchmark's anchors."`
	Isolation                string        `name:"isolation" default:"read-committed" enum:"read-committed,serializable,article-serializable" help:"Isolation of the idempotency phases (docs/api-authors.md, Isolation); article-serializable is the article's protocol, the load benchmark's anchor."`
	ReceiptWorkers           int           `name:"receipt-workers" default:"10" help:"Receipt worker concurrency."`
}

// CommonConfig implements daemon.Command.
func (c *Command) CommonConfig() *config.Common { return &c.Common }

// LongRunning implements daemon.Command: the API serves until SIGTERM.
func (c *Command) LongRunning() bool { return true }

// Check lists every configuration problem.
func (c *Command) Check() []string {
	p := c.Common.Check()
	if c.StripeURL != "" && c.StripeKeyFile == "" {
		p = append(p, "--stripe-key-file is required with --stripe-url")
	}
	if c.FaultRate < 0 || c.FaultRate > 1 {
		p = append(p, "--fault-rate must be within 0..1")
	}
	switch c.FaultAt {
	case "", api.AtBefore, api.RecoveryPointStarted, api.RecoveryPointRideCreated, api.RecoveryPointChargeCreated:
	default:
		p = append(p, fmt.Sprintf("--fault-at %q: want before, started, ride_created or charge_created", c.FaultAt))
	}
	if c.ReceiptWorkers <= 0 {
		p = append(p, "--receipt-workers must be positive")
	}
	return p
}

// Run implements daemon.Command.
func (c *Command) Run(ctx context.Context, env *daemon.Env) error {
	log := env.Logger
	if err := api.Migrate(ctx, env.Pool); err != nil {
		return err
	}

	stripeURL, stripeKey := c.StripeURL, "sk_test_rocketrides_fake"
	var stops []func(context.Context) error
	defer func() {
		sctx, cancel := context.WithTimeout(context.Background(), c.ShutdownTimeout)
		defer cancel()
		for i := len(stops) - 1; i >= 0; i-- {
			if err := stops[i](sctx); err != nil {
				log.Warn("shutdown", zap.Error(err))
			}
		}
	}()

	if stripeURL == "" {
		fake := fakestripe.New()
		fake.SetLatency(c.StripeLatency)
		addr, stop, err := serve(c.StripeAddr, fake)
		if err != nil {
			return fmt.Errorf("fake stripe: %w", err)
		}
		stops = append(stops, stop)
		stripeURL = "http://" + addr
		log.Info("fake stripe listening", zap.String("addr", addr),
			zap.String("charges", "http://"+addr+"/_fake/charges"), zap.String("stats", "http://"+addr+"/_fake/stats"))
	} else {
		s, err := readSecretFile(c.StripeKeyFile)
		if err != nil {
			return &config.Error{Problems: []string{"--stripe-key-file: " + err.Error()}}
		}
		stripeKey = s
	}

	var verifier *replayauth.Verifier
	if c.ReplaySecretFile != "" {
		secrets, err := replayauth.ReadSecretFiles(c.ReplaySecretFile, c.ReplaySecretFilePrevious)
		if err != nil {
			return &config.Error{Problems: []string{err.Error()}}
		}
		if verifier, err = replayauth.NewVerifier(0, secrets...); err != nil {
			return err
		}
		// Nonces in PostgreSQL, shared with every other replica of this
		// API (idem.ReplayAuth's default, made explicit here for the
		// metrics).
		nonces := idem.NewReplayNonces(env.Pool, idem.ReplayNoncesOptions{Logger: logging.Slog(log)})
		verifier = verifier.WithNonceStore(nonces)
		registerNonceMetrics(env.Registry, nonces)
	} else {
		log.Warn("no --replay-secret-file: the completer's replay path is disabled")
	}

	faults := api.NewFaults()
	if c.FaultRate > 0 {
		if err := faults.Set(api.FaultRule{At: c.FaultAt, Rate: c.FaultRate, Kind: api.FaultKind(c.FaultKind)}); err != nil {
			return &config.Error{Problems: []string{err.Error()}}
		}
	}

	// The River client: the receipt worker, and the inserts of
	// --receipt-jobs river (an insert-only client when the worker is off).
	var rc *river.Client[pgx.Tx]
	if c.Receipts || c.ReceiptJobs == string(api.ReceiptJobsRiver) {
		var err error
		if rc, err = newRiverClient(env.Pool, log, c.Receipts, c.ReceiptWorkers); err != nil {
			return err
		}
	}
	isolation := map[string]idem.Isolation{
		"read-committed": idem.ReadCommitted, "serializable": idem.Serializable, "article-serializable": idem.ArticleSerializable,
	}[c.Isolation]
	h, err := api.New(api.Config{
		Pool: env.Pool, StripeURL: stripeURL, StripeKey: stripeKey, Replay: verifier, Logger: log, Faults: faults,
		Isolation: isolation, ReceiptJobs: api.ReceiptJobs(c.ReceiptJobs), River: rc,
	})
	if err != nil {
		return err
	}
	responses := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "rocketrides_http_responses_total", Help: "API responses by status code.",
	}, []string{"code"})
	env.Registry.MustRegister(responses)
	addr, stop, err := serve(c.Addr, countResponses(h, responses))
	if err != nil {
		return fmt.Errorf("api: %w", err)
	}
	stops = append(stops, stop)
	log.Info("rocketrides API listening", zap.String("addr", addr))

	if c.AdminAddr != "" {
		mux := http.NewServeMux()
		mux.Handle("/faults", faults)
		a, stop, err := serve(c.AdminAddr, mux)
		if err != nil {
			return fmt.Errorf("admin: %w", err)
		}
		stops = append(stops, stop)
		log.Info("admin listening", zap.String("faults", "http://"+a+"/faults"))
	}

	if c.Receipts {
		// Started on a context that outlives SIGTERM, so Stop can drain.
		if err := rc.Start(context.WithoutCancel(ctx)); err != nil {
			return fmt.Errorf("receipts: start river: %w", err)
		}
		stops = append(stops, rc.Stop)
	}
	env.Ready.MarkStarted(time.Now())
	<-ctx.Done()
	return nil
}

// newRiverClient returns the River client of the receipt worker (workers
// workers) or, with work false, an insert-only client.
func newRiverClient(pool *pgxpool.Pool, log *zap.Logger, work bool, workers int) (*river.Client[pgx.Tx], error) {
	cfg := &river.Config{Logger: logging.Slog(log)}
	if work {
		// A receipt is one INSERT: a job still running after 30 s is
		// hung. A job whose completion was lost (the database froze or
		// went away mid-job, and River's completer gave up on writing
		// its state) stays running until the rescuer's threshold: a
		// minute, not River's default hour. Running a receipt again is
		// harmless (one receipt per River job).
		cfg.JobTimeout = 30 * time.Second
		cfg.RescueStuckJobsAfter = time.Minute
		ws := river.NewWorkers()
		receipts.Register(ws, pool)
		cfg.Queues = map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: workers}}
		cfg.Workers = ws
	}
	rc, err := river.NewClient[pgx.Tx](riverpgxv5.New(pool), cfg)
	if err != nil {
		return nil, fmt.Errorf("receipts: river client: %w", err)
	}
	return rc, nil
}

func serve(addr string, h http.Handler) (string, func(context.Context) error, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return "", nil, err
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	return ln.Addr().String(), func(ctx context.Context) error {
		err := srv.Shutdown(ctx)
		if serr := <-done; serr != nil && !errors.Is(serr, http.ErrServerClosed) {
			return serr
		}
		return err
	}, nil
}

// registerNonceMetrics exports the replay nonce store's counters: a
// refused replay because its nonce could not be recorded (the API answered
// 503) and a failed cleanup are never silent.
func registerNonceMetrics(reg prometheus.Registerer, nonces *idem.ReplayNonces) {
	for _, op := range []struct {
		name string
		read func(idem.ReplayNonceStats) uint64
	}{
		{"record", func(s idem.ReplayNonceStats) uint64 { return s.UseErrors }},
		{"cleanup", func(s idem.ReplayNonceStats) uint64 { return s.CleanupErrors }},
	} {
		reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name:        "rocketrides_replay_nonce_errors_total",
			Help:        "Replay nonce store (idemd_replay_nonces) failures: record (the signed replay was refused with 503) or cleanup (retried at the next interval).",
			ConstLabels: prometheus.Labels{"op": op.name},
		}, func() float64 { return float64(op.read(nonces.Stats())) }))
	}
	reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{
		Name: "rocketrides_replay_nonces_deleted_total",
		Help: "Expired replay nonces deleted from idemd_replay_nonces by this process.",
	}, func() float64 { return float64(nonces.Stats().Deleted) }))
}

type statusRecorder struct {
	http.ResponseWriter
	code int
}

func (s *statusRecorder) WriteHeader(code int) {
	s.code = code
	s.ResponseWriter.WriteHeader(code)
}

func countResponses(h http.Handler, c *prometheus.CounterVec) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rec := &statusRecorder{ResponseWriter: w, code: http.StatusOK}
		h.ServeHTTP(rec, r)
		c.WithLabelValues(strconv.Itoa(rec.code)).Inc()
	})
}

func readSecretFile(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	s := strings.TrimSpace(string(b))
	if s == "" {
		return "", errors.New("file is empty")
	}
	return s, nil
}
