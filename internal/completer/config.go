package completer

import (
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/idemd/idemd/idem/replayauth"
	"github.com/idemd/idemd/internal/config"
	"github.com/idemd/idemd/internal/dbcall"
	"github.com/idemd/idemd/internal/opshttp"
)

// Encoding is how a stored request_params object is sent as the body.
type Encoding string

const (
	EncodingJSON Encoding = "json" // application/json, the stored JSON text
	EncodingForm Encoding = "form" // application/x-www-form-urlencoded, Stripe-style brackets
)

// leaseMargin is kept free at the end of a lease for the post-request
// database writes: a request is only sent when RequestTimeout+leaseMargin of
// the lease remains.
const leaseMargin = 2 * time.Second

// maxBatchSize bounds one claim whatever --batch-size says.
const maxBatchSize = 10_000

// Settings are the operator-facing knobs. cmd/completer parses them from
// flags (each has an IDEMD_ environment variable through kong's
// DefaultEnvars); their defaults are DefaultSettings. Zero is a value: a
// zero --grace, --idle or --lock-timeout means "no wait".
type Settings struct {
	APIURL string `name:"api-url" help:"Base URL of the API the stored requests are replayed against (e.g. http://api.default.svc:8080). Required."`

	Grace       time.Duration `name:"grace" default:"${grace}" help:"Leave a key alone this long after its creation."`
	Idle        time.Duration `name:"idle" default:"${idle}" help:"Leave a key alone this long after its last run."`
	LockTimeout time.Duration `name:"lock-timeout" default:"${lock_timeout}" help:"A key locked more recently than this is a live request; match the API's lock timeout."`
	Lease       time.Duration `name:"lease" default:"${lease}" help:"How long a claimed key belongs to this replica; must exceed --request-timeout."`

	MaxAttempts     int           `name:"max-attempts" default:"${max_attempts}" help:"Failed attempts (5xx, network, 401, 409 on a key no request holds, other 4xx) before giving up and flagging the key for review."`
	GiveUpAfter     time.Duration `name:"give-up-after" default:"${give_up_after}" help:"Give up on keys older than this (keep it inside the payment provider's idempotency-key memory, 24h at Stripe)."`
	BackoffBase     time.Duration `name:"backoff-base" default:"${backoff_base}" help:"Retry delay cap after the first failure; doubles per attempt (full jitter)."`
	BackoffMax      time.Duration `name:"backoff-max" default:"${backoff_max}" help:"Largest retry delay cap."`
	InProgressDelay time.Duration `name:"in-progress-delay" default:"${in_progress_delay}" help:"After a 409 on a key the API holds locked (a live request), look again this much later."`

	Concurrency    int           `name:"concurrency" default:"${concurrency}" help:"Most replays in flight at once in this process; lowered while replays conflict in the API (409 on keys no request holds), raised again as they clear."`
	Rate           float64       `name:"rate" default:"${rate}" help:"Replays per second, at most, from this process."`
	Burst          int           `name:"burst" default:"${burst}" help:"Rate limiter burst."`
	BatchSize      int           `name:"batch-size" default:"${batch_size}" help:"Keys claimed per batch."`
	PollInterval   time.Duration `name:"poll-interval" default:"${poll_interval}" help:"Pause between passes once nothing is due."`
	RequestTimeout time.Duration `name:"request-timeout" default:"${request_timeout}" help:"Timeout of one replay request."`
	Encoding       Encoding      `name:"request-encoding" default:"${request_encoding}" enum:"json,form" help:"Body encoding of replays: json (stored params as is) or form (Stripe-style a[b]=c)."`

	BreakerFailures    int           `name:"breaker-failures" default:"${breaker_failures}" help:"Consecutive failures (5xx, 429, 401, network) that open the circuit breaker. A key that fails again after the API answered other keys in between is failing on its own and does not count."`
	BreakerCooldown    time.Duration `name:"breaker-cooldown" default:"${breaker_cooldown}" help:"First open period of the breaker; doubles on every failed probe."`
	BreakerMaxCooldown time.Duration `name:"breaker-max-cooldown" default:"${breaker_max_cooldown}" help:"Longest open period of the breaker."`
}

// DefaultSettings returns the settings with every default filled in, as
// kong would parse an empty command line (APIURL has none). It is the only
// place a default is written.
func DefaultSettings() Settings {
	return Settings{
		Grace:              5 * time.Minute,
		Idle:               time.Minute,
		LockTimeout:        90 * time.Second, // idem.DefaultLockTimeout, the API's
		Lease:              2 * time.Minute,
		MaxAttempts:        20,
		GiveUpAfter:        23 * time.Hour,
		BackoffBase:        10 * time.Second,
		BackoffMax:         time.Hour,
		InProgressDelay:    30 * time.Second,
		Concurrency:        8,
		Rate:               20,
		Burst:              10,
		BatchSize:          100,
		PollInterval:       10 * time.Second,
		RequestTimeout:     30 * time.Second,
		Encoding:           EncodingJSON,
		BreakerFailures:    5,
		BreakerCooldown:    5 * time.Second,
		BreakerMaxCooldown: 2 * time.Minute,
	}
}

// Check returns every problem with the settings, not just the first, each
// named by its flag. It is the completer's only list of rules.
func (s *Settings) Check() []string {
	var p []string
	if strings.TrimSpace(s.APIURL) == "" {
		p = append(p, "--api-url is required")
	} else if u, err := url.Parse(s.APIURL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		p = append(p, fmt.Sprintf("--api-url %q: must be an absolute http(s) URL", redactURL(s.APIURL)))
	} else if u.User != nil {
		p = append(p, "--api-url must not carry credentials; the replay signature authenticates")
	}
	nonNeg := func(name string, d time.Duration) {
		if d < 0 {
			p = append(p, name+" must not be negative")
		}
	}
	pos := func(name string, d time.Duration) {
		if d <= 0 {
			p = append(p, name+" must be positive")
		}
	}
	nonNeg("--grace", s.Grace)
	nonNeg("--idle", s.Idle)
	nonNeg("--lock-timeout", s.LockTimeout)
	pos("--lease", s.Lease)
	pos("--give-up-after", s.GiveUpAfter)
	pos("--backoff-base", s.BackoffBase)
	pos("--backoff-max", s.BackoffMax)
	pos("--in-progress-delay", s.InProgressDelay)
	pos("--poll-interval", s.PollInterval)
	pos("--request-timeout", s.RequestTimeout)
	pos("--breaker-cooldown", s.BreakerCooldown)
	pos("--breaker-max-cooldown", s.BreakerMaxCooldown)
	if s.BackoffMax > 0 && s.BackoffBase > s.BackoffMax {
		p = append(p, "--backoff-base must not exceed --backoff-max")
	}
	if s.Lease > 0 && s.RequestTimeout > 0 && s.Lease < s.RequestTimeout+2*leaseMargin {
		p = append(p, fmt.Sprintf("--lease (%s) must exceed --request-timeout (%s) by at least %s, or no replay could finish inside its lease", s.Lease, s.RequestTimeout, 2*leaseMargin))
	}
	if s.MaxAttempts < 1 {
		p = append(p, "--max-attempts must be at least 1")
	}
	if s.Concurrency < 1 {
		p = append(p, "--concurrency must be at least 1")
	}
	if s.Rate <= 0 {
		p = append(p, "--rate must be positive")
	}
	if s.Burst < 1 {
		p = append(p, "--burst must be at least 1")
	}
	if s.BatchSize < 1 || s.BatchSize > maxBatchSize {
		p = append(p, fmt.Sprintf("--batch-size must be between 1 and %d", maxBatchSize))
	}
	if s.BreakerFailures < 1 {
		p = append(p, "--breaker-failures must be at least 1")
	}
	switch s.Encoding {
	case EncodingJSON, EncodingForm:
	default:
		p = append(p, fmt.Sprintf("--request-encoding %q: must be json or form", s.Encoding))
	}
	return p
}

// Config is what New needs: the settings plus what is not a flag.
type Config struct {
	Settings

	Pool *pgxpool.Pool
	// Calls bounds every database call (--database-timeout); nil bounds
	// them by its default and counts nothing.
	Calls *dbcall.Bounds
	// Signer signs each replay (one secret, or two during a rotation).
	Signer *replayauth.Signer
	// HTTPClient is optional; the default does not follow redirects and
	// keeps Concurrency idle connections.
	HTTPClient *http.Client
	Logger     *zap.Logger
	Registry   prometheus.Registerer // nil: metrics are not registered
	// Ready, when set, is marked after every pass that did its job (and
	// after every batch of a long pass), so /readyz reflects a stuck loop.
	Ready *opshttp.Readiness
}

func (c *Config) check() error {
	p := c.Settings.Check()
	if c.Signer == nil {
		p = append(p, "a replay Signer is required")
	}
	if c.Pool == nil {
		p = append(p, "a database pool is required")
	}
	return config.Problems(p)
}

// redactURL drops userinfo so a password in a mistyped URL is never echoed.
func redactURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "(unparseable)"
	}
	return u.Redacted()
}
