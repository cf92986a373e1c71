// Package api is Rocket Rides, the article's reference API, built on package
// idem: POST /rides runs the atomic phases started → ride_created →
// charge_created → finished, charging through stripe-go with the key's
// upstream idempotency key and staging the receipt job.
//
// Riders authenticate with "Authorization: Bearer <api key>". idemd's
// completer authenticates through idem.ReplayAuth (the signed replay path)
// and is then served exactly as the key's user.
package api

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/stripe/stripe-go/v82"
	"go.uber.org/zap"

	"github.com/idemd/idemd/idem"
	"github.com/idemd/idemd/idem/replayauth"
)

// MinKeyLength is the article's minimum length for new idempotency keys.
const MinKeyLength = 20

// Config configures the API.
type Config struct {
	Pool      *pgxpool.Pool
	StripeURL string // base URL of Stripe (the fake in tests and the demo)
	StripeKey string // Stripe secret key; never logged
	// Replay verifies the completer's signature; nil disables the path.
	Replay *replayauth.Verifier
	Logger *zap.Logger
	// Faults is the runtime fault switch; nil injects nothing.
	Faults *Faults

	// Optional.
	MinKeyLength     int           // default MinKeyLength
	LockTimeout      time.Duration // default idem.DefaultLockTimeout
	StripeHTTPClient *http.Client  // default a dedicated client with a 30 s timeout
	// Isolation of the phases (default idem.ReadCommitted: the phases lock
	// the key row and touch no row another key's request writes).
	Isolation idem.Isolation
	// ReceiptJobs is how a paid ride's receipt job is created: staged for
	// idemd's enqueuer (the default), inserted into River directly with
	// InsertTx (River must be set), or not at all. The last two exist for
	// the load benchmark's anchors (internal/testing/e2e/load).
	ReceiptJobs ReceiptJobs
	River       *river.Client[pgx.Tx]
}

// ReceiptJobs is how the receipt job is created in the ride's last phase.
type ReceiptJobs string

const (
	// ReceiptJobsStaged stages it with idem.StageJob (idemd's enqueuer
	// moves it into River).
	ReceiptJobsStaged ReceiptJobs = "staged"
	// ReceiptJobsRiver inserts it with River's InsertTx in the phase's
	// transaction: what a Go API would do without idemd.
	ReceiptJobsRiver ReceiptJobs = "river"
	// ReceiptJobsNone creates no job.
	ReceiptJobsNone ReceiptJobs = "none"
)

type server struct {
	store       *idem.Store
	pool        *pgxpool.Pool
	stripe      *stripe.Client
	faults      *Faults
	log         *zap.Logger
	receiptJobs ReceiptJobs
	river       *river.Client[pgx.Tx]
}

// New returns the API's handler.
func New(cfg Config) (http.Handler, error) {
	var problems []string
	if cfg.Pool == nil {
		problems = append(problems, "Pool is required")
	}
	if cfg.StripeURL == "" {
		problems = append(problems, "StripeURL is required")
	}
	if cfg.StripeKey == "" {
		problems = append(problems, "StripeKey is required")
	}
	switch cfg.ReceiptJobs {
	case "", ReceiptJobsStaged, ReceiptJobsNone:
	case ReceiptJobsRiver:
		if cfg.River == nil {
			problems = append(problems, "River is required with ReceiptJobs river")
		}
	default:
		problems = append(problems, fmt.Sprintf("ReceiptJobs %q: want staged, river or none", cfg.ReceiptJobs))
	}
	if len(problems) > 0 {
		return nil, errors.New("rocketrides: config: " + strings.Join(problems, "; "))
	}
	receiptJobs := cfg.ReceiptJobs
	if receiptJobs == "" {
		receiptJobs = ReceiptJobsStaged
	}
	log := cfg.Logger
	if log == nil {
		log = zap.NewNop()
	}
	minLen := cfg.MinKeyLength
	if minLen <= 0 {
		minLen = MinKeyLength
	}
	hc := cfg.StripeHTTPClient
	if hc == nil {
		hc = &http.Client{Timeout: 30 * time.Second}
	}
	backend := stripe.GetBackendWithConfig(stripe.APIBackend, &stripe.BackendConfig{
		URL:        stripe.String(cfg.StripeURL),
		HTTPClient: hc,
		// Retries belong to the protocol (client, completer), each with the
		// same upstream key; retrying inside a phase would only hold the
		// phase's transaction (and the key's row lock) open longer.
		MaxNetworkRetries: stripe.Int64(0),
		LeveledLogger:     &stripe.LeveledLogger{Level: stripe.LevelNull},
	})
	sc := stripe.NewClient(cfg.StripeKey, stripe.WithBackends(&stripe.Backends{
		API: backend, Connect: backend, Uploads: backend, MeterEvents: backend,
	}))
	s := &server{
		store: idem.New(cfg.Pool, idem.Options{
			MinKeyLength: minLen,
			LockTimeout:  cfg.LockTimeout,
			Isolation:    cfg.Isolation,
			Logger:       zapSlog(log),
		}),
		pool:        cfg.Pool,
		stripe:      sc,
		faults:      cfg.Faults,
		log:         log,
		receiptJobs: receiptJobs,
		river:       cfg.River,
	}
	mux := http.NewServeMux()
	mux.Handle("POST /rides", s.authenticate(http.HandlerFunc(s.createRide)))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) { _, _ = w.Write([]byte("ok\n")) })
	return s.store.ReplayAuth(cfg.Replay)(mux), nil
}

// Messages of the API's own errors (the article's).
const (
	msgAuthRequired = "Please specify credentials in the Authorization header."
	msgAuthInvalid  = "Credentials in Authorization were invalid."
)

type userKey struct{}

func userFrom(ctx context.Context) *User { return ctx.Value(userKey{}).(*User) }

// authenticate resolves the rider: from the replay path's signed user id
// when idem.ReplayAuth accepted the request, else from the bearer API key.
func (s *server) authenticate(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx := r.Context()
		var (
			u   *User
			err error
		)
		if id, ok := idem.ReplayUserID(ctx); ok {
			u, err = userByID(ctx, s.pool, id)
		} else {
			h := r.Header.Get("Authorization")
			if h == "" {
				idem.WriteJSONError(w, http.StatusUnauthorized, msgAuthRequired)
				return
			}
			token, ok := strings.CutPrefix(h, "Bearer ")
			if !ok || token == "" {
				idem.WriteJSONError(w, http.StatusUnauthorized, msgAuthInvalid)
				return
			}
			u, err = userByAPIKey(ctx, s.pool, token)
		}
		switch {
		case errors.Is(err, errNoUser):
			idem.WriteJSONError(w, http.StatusUnauthorized, msgAuthInvalid)
			return
		case err != nil:
			s.log.Error("authenticate: user lookup failed", zap.Error(err))
			idem.WriteJSONError(w, http.StatusServiceUnavailable, idem.MsgInternal)
			return
		}
		next.ServeHTTP(w, r.WithContext(context.WithValue(ctx, userKey{}, u)))
	})
}
