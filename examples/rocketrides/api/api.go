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
	"net/http"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stripe/stripe-go/v82"
	"go.uber.org/zap"

	"idemd/idem"
	"idemd/idem/replayauth"
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
}

type server struct {
	store  *idem.Store
	pool   *pgxpool.Pool
	stripe *stripe.Client
	faults *Faults
	log    *zap.Logger
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
	if len(problems) > 0 {
		return nil, errors.New("rocketrides: config: " + strings.Join(problems, "; "))
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
		// SERIALIZABLE transaction open longer.
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
			Logger:       zapSlog(log),
		}),
		pool:   cfg.Pool,
		stripe: sc,
		faults: cfg.Faults,
		log:    log,
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
