package completer

import (
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"idemd/idem/replayauth"
)

// Encoding is how a stored request_params object is sent as the body.
type Encoding string

const (
	EncodingJSON Encoding = "json" // application/json, the stored JSON text
	EncodingForm Encoding = "form" // application/x-www-form-urlencoded, Stripe-style brackets
)

// Defaults of the flags in cmd/completer (kept in one place).
const (
	DefaultGrace           = 5 * time.Minute
	DefaultIdle            = time.Minute
	DefaultLockTimeout     = 90 * time.Second
	DefaultLease           = 2 * time.Minute
	DefaultMaxAttempts     = 20
	DefaultGiveUpAfter     = 23 * time.Hour
	DefaultBackoffBase     = 10 * time.Second
	DefaultBackoffMax      = time.Hour
	DefaultInProgressDelay = 30 * time.Second
	DefaultConcurrency     = 8
	DefaultRate            = 20.0
	DefaultBurst           = 10
	DefaultBatchSize       = 100
	DefaultPollInterval    = 10 * time.Second
	DefaultRequestTimeout  = 30 * time.Second
	DefaultBreakerFailures = 5
	DefaultBreakerCooldown = 5 * time.Second
	DefaultBreakerMaxCool  = 2 * time.Minute
)

// leaseMargin is kept free at the end of a lease for the post-request
// database writes: a request is only sent when RequestTimeout+leaseMargin of
// the lease remains.
const leaseMargin = 2 * time.Second

// Config configures a Service. Zero durations for Grace, Idle and
// LockTimeout mean "no wait" (tests); everything else must be positive.
type Config struct {
	// APIURL is the API's base URL; the stored request_path is appended.
	APIURL string
	// Signer signs each replay (one secret, or two during a rotation).
	Signer *replayauth.Signer
	// HTTPClient is optional; the default does not follow redirects and
	// keeps Concurrency idle connections.
	HTTPClient *http.Client

	Grace       time.Duration // a key is left alone this long after creation
	Idle        time.Duration // ... and this long after its last run
	LockTimeout time.Duration // a lock younger than this is a live request
	Lease       time.Duration // how long a claimed key is ours

	MaxAttempts     int           // failed attempts before giving up
	GiveUpAfter     time.Duration // horizon after creation; past it, give up
	BackoffBase     time.Duration // first retry delay cap; doubles per attempt
	BackoffMax      time.Duration // cap of the retry delay
	InProgressDelay time.Duration // after a 409, look again this much later

	Concurrency    int
	Rate           float64 // replays per second, global to this process
	Burst          int
	BatchSize      int
	PollInterval   time.Duration
	RequestTimeout time.Duration
	Encoding       Encoding

	BreakerFailures    int           // consecutive failures that open the breaker
	BreakerCooldown    time.Duration // first open period
	BreakerMaxCooldown time.Duration // cap of the doubling open period

	Logger   *zap.Logger
	Registry prometheus.Registerer
	// Ready, when set, is told about every completed pass (for /readyz).
	Ready interface{ MarkPass(time.Time) }
}

// DefaultConfig returns a Config with every default filled in; the caller
// sets APIURL and Signer.
func DefaultConfig() Config {
	return Config{
		Grace: DefaultGrace, Idle: DefaultIdle, LockTimeout: DefaultLockTimeout, Lease: DefaultLease,
		MaxAttempts: DefaultMaxAttempts, GiveUpAfter: DefaultGiveUpAfter,
		BackoffBase: DefaultBackoffBase, BackoffMax: DefaultBackoffMax, InProgressDelay: DefaultInProgressDelay,
		Concurrency: DefaultConcurrency, Rate: DefaultRate, Burst: DefaultBurst, BatchSize: DefaultBatchSize,
		PollInterval: DefaultPollInterval, RequestTimeout: DefaultRequestTimeout, Encoding: EncodingJSON,
		BreakerFailures: DefaultBreakerFailures, BreakerCooldown: DefaultBreakerCooldown, BreakerMaxCooldown: DefaultBreakerMaxCool,
	}
}

// Problems lists everything wrong with c (empty when valid). It is what
// cmd/completer reports before exiting 2.
func (c *Config) Problems() []string {
	var p []string
	if strings.TrimSpace(c.APIURL) == "" {
		p = append(p, "--api-url is required")
	} else if u, err := url.Parse(c.APIURL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		p = append(p, fmt.Sprintf("--api-url %q: must be an absolute http(s) URL", redactURL(c.APIURL)))
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
	nonNeg("--grace", c.Grace)
	nonNeg("--idle", c.Idle)
	nonNeg("--lock-timeout", c.LockTimeout)
	pos("--lease", c.Lease)
	pos("--give-up-after", c.GiveUpAfter)
	pos("--backoff-base", c.BackoffBase)
	pos("--backoff-max", c.BackoffMax)
	pos("--in-progress-delay", c.InProgressDelay)
	pos("--poll-interval", c.PollInterval)
	pos("--request-timeout", c.RequestTimeout)
	pos("--breaker-cooldown", c.BreakerCooldown)
	pos("--breaker-max-cooldown", c.BreakerMaxCooldown)
	if c.BackoffMax > 0 && c.BackoffBase > c.BackoffMax {
		p = append(p, "--backoff-base must not exceed --backoff-max")
	}
	if c.Lease > 0 && c.RequestTimeout > 0 && c.Lease < c.RequestTimeout+2*leaseMargin {
		p = append(p, fmt.Sprintf("--lease (%s) must exceed --request-timeout (%s) by at least %s, or no replay could finish inside its lease", c.Lease, c.RequestTimeout, 2*leaseMargin))
	}
	if c.MaxAttempts < 1 {
		p = append(p, "--max-attempts must be at least 1")
	}
	if c.Concurrency < 1 {
		p = append(p, "--concurrency must be at least 1")
	}
	if c.Rate <= 0 {
		p = append(p, "--rate must be positive")
	}
	if c.Burst < 1 {
		p = append(p, "--burst must be at least 1")
	}
	if c.BatchSize < 1 || c.BatchSize > 10_000 {
		p = append(p, "--batch-size must be between 1 and 10000")
	}
	if c.BreakerFailures < 1 {
		p = append(p, "--breaker-failures must be at least 1")
	}
	switch c.Encoding {
	case EncodingJSON, EncodingForm:
	default:
		p = append(p, fmt.Sprintf("--request-encoding %q: must be json or form", c.Encoding))
	}
	return p
}

// redactURL drops userinfo so a password in a mistyped URL is never echoed.
func redactURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "(unparseable)"
	}
	return u.Redacted()
}
