package completer

import (
	"context"
	"fmt"
	"time"

	"go.uber.org/zap"

	"idemd/idem/replayauth"
	"idemd/internal/config"
	"idemd/internal/daemon"
)

// Description is the completer's --help summary.
const Description = "Drive abandoned idempotency keys to finished by replaying their stored requests against the API through the signed internal path."

// CLI is cmd/completer's configuration. Every flag also reads IDEMD_<NAME>
// (e.g. IDEMD_API_URL, IDEMD_MAX_ATTEMPTS).
type CLI struct {
	config.Common `embed:""`

	APIURL                 string        `name:"api-url" help:"Base URL of the API the stored requests are replayed against (e.g. http://api.default.svc:8080). Required."`
	AuthSecretFile         string        `name:"auth-secret-file" help:"File holding the current replay signing secret (>= 32 bytes). Required."`
	AuthSecretFilePrevious string        `name:"auth-secret-file-previous" help:"File holding the previous secret during a rotation; replays are then signed with both."`
	Grace                  time.Duration `name:"grace" default:"5m" help:"Leave a key alone this long after its creation."`
	Idle                   time.Duration `name:"idle" default:"1m" help:"Leave a key alone this long after its last run."`
	LockTimeout            time.Duration `name:"lock-timeout" default:"90s" help:"A key locked more recently than this is a live request; match the API's lock timeout."`
	Lease                  time.Duration `name:"lease" default:"2m" help:"How long a claimed key belongs to this replica; must exceed --request-timeout."`
	MaxAttempts            int           `name:"max-attempts" default:"20" help:"Failed attempts (5xx, network, 401, other 4xx) before giving up and flagging the key for review."`
	GiveUpAfter            time.Duration `name:"give-up-after" default:"23h" help:"Give up on keys older than this (keep it inside the payment provider's idempotency-key memory, 24h at Stripe)."`
	BackoffBase            time.Duration `name:"backoff-base" default:"10s" help:"Retry delay cap after the first failure; doubles per attempt (full jitter)."`
	BackoffMax             time.Duration `name:"backoff-max" default:"1h" help:"Largest retry delay cap."`
	InProgressDelay        time.Duration `name:"in-progress-delay" default:"30s" help:"After a 409 (a live request holds the key), look again this much later."`
	Concurrency            int           `name:"concurrency" default:"8" help:"Replays in flight at once in this process."`
	Rate                   float64       `name:"rate" default:"20" help:"Replays per second, at most, from this process."`
	Burst                  int           `name:"burst" default:"10" help:"Rate limiter burst."`
	BatchSize              int           `name:"batch-size" default:"100" help:"Keys claimed per pass."`
	PollInterval           time.Duration `name:"poll-interval" default:"10s" help:"Pause between sweeps once nothing is due."`
	RequestTimeout         time.Duration `name:"request-timeout" default:"30s" help:"Timeout of one replay request."`
	RequestEncoding        string        `name:"request-encoding" default:"json" enum:"json,form" help:"Body encoding of replays: json (stored params as is) or form (Stripe-style a[b]=c)."`
	BreakerFailures        int           `name:"breaker-failures" default:"5" help:"Consecutive failures (5xx, 429, 401, network) that open the circuit breaker. A key that fails again after the API answered other keys in between is failing on its own and does not count."`
	BreakerCooldown        time.Duration `name:"breaker-cooldown" default:"5s" help:"First open period of the breaker; doubles on every failed probe."`
	BreakerMaxCooldown     time.Duration `name:"breaker-max-cooldown" default:"2m" help:"Longest open period of the breaker."`
	Once                   bool          `name:"once" help:"Do one sweep (claim and process until no key is due right now) and exit 0."`
}

// CommonConfig implements daemon.Command.
func (c *CLI) CommonConfig() *config.Common { return &c.Common }

// serviceConfig maps flags to a Config (without Signer, Logger, Registry).
func (c *CLI) serviceConfig() Config {
	return Config{
		APIURL: c.APIURL, Grace: c.Grace, Idle: c.Idle, LockTimeout: c.LockTimeout, Lease: c.Lease,
		MaxAttempts: c.MaxAttempts, GiveUpAfter: c.GiveUpAfter, BackoffBase: c.BackoffBase, BackoffMax: c.BackoffMax,
		InProgressDelay: c.InProgressDelay, Concurrency: c.Concurrency, Rate: c.Rate, Burst: c.Burst,
		BatchSize: c.BatchSize, PollInterval: c.PollInterval, RequestTimeout: c.RequestTimeout,
		Encoding: Encoding(c.RequestEncoding), BreakerFailures: c.BreakerFailures,
		BreakerCooldown: c.BreakerCooldown, BreakerMaxCooldown: c.BreakerMaxCooldown,
	}
}

// Check lists every configuration problem (exit 2), including unreadable
// or too-short secret files. It never prints a secret.
func (c *CLI) Check() []string {
	p := c.Common.Check()
	cfg := c.serviceConfig()
	p = append(p, cfg.Problems()...)
	if c.AuthSecretFile == "" {
		p = append(p, "--auth-secret-file is required")
	} else if _, err := replayauth.ReadSecretFiles(c.AuthSecretFile); err != nil {
		p = append(p, "--auth-secret-file: "+err.Error())
	}
	if c.AuthSecretFilePrevious != "" {
		if _, err := replayauth.ReadSecretFiles(c.AuthSecretFilePrevious); err != nil {
			p = append(p, "--auth-secret-file-previous: "+err.Error())
		}
	}
	return p
}

// Run implements daemon.Command.
func (c *CLI) Run(ctx context.Context, env *daemon.Env) error {
	secrets, err := replayauth.ReadSecretFiles(c.AuthSecretFile, c.AuthSecretFilePrevious)
	if err != nil {
		return &config.Error{Problems: []string{err.Error()}}
	}
	signer, err := replayauth.NewSigner(secrets...)
	if err != nil {
		return &config.Error{Problems: []string{err.Error()}}
	}
	cfg := c.serviceConfig()
	cfg.Signer = signer
	cfg.Logger = env.Logger
	cfg.Registry = env.Registry
	cfg.Ready = env.Ready
	if env.Ready != nil {
		env.Ready.MaxPassAge = 3*c.PollInterval + 2*c.Lease
		env.Ready.MarkStarted(time.Now())
	}
	svc, err := New(env.Pool, cfg)
	if err != nil {
		return &config.Error{Problems: []string{err.Error()}}
	}
	env.Logger.Info("completer starting",
		zap.String("api_url", redactURL(c.APIURL)), zap.Int("secrets", len(secrets)),
		zap.Bool("once", c.Once), zap.Int("concurrency", c.Concurrency), zap.Float64("rate", c.Rate))
	if c.Once {
		res, err := svc.Sweep(ctx)
		env.Logger.Info("completer sweep done",
			zap.Int("claimed", res.Claimed), zap.Int("finished", res.Finished),
			zap.Int("in_progress", res.InProgress), zap.Int("retried", res.Retried),
			zap.Int("unauthorized", res.Unauthorized), zap.Int("rejected", res.Rejected),
			zap.Int("gave_up", res.GaveUp), zap.Int("deferred", res.Deferred),
			zap.Int("lease_lost", res.LeaseLost), zap.Int("gone", res.Gone), zap.Bool("breaker_open", res.BreakerOpen))
		if err != nil && ctx.Err() == nil {
			return fmt.Errorf("sweep: %w", err)
		}
		return nil
	}
	return daemon.RunService(ctx, svc, c.ShutdownTimeout)
}
