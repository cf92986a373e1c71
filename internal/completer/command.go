package completer

import (
	"context"

	"go.uber.org/zap"

	"github.com/idemd/idemd/idem/replayauth"
	"github.com/idemd/idemd/internal/config"
	"github.com/idemd/idemd/internal/daemon"
	"github.com/idemd/idemd/internal/dbstats"
)

// Description is the completer's --help summary.
const Description = "Drive abandoned idempotency keys to finished by replaying their stored requests against the API through the signed internal path."

// Command is the completer's command line, run by daemon.Main. Every flag
// also reads IDEMD_<NAME> (e.g. IDEMD_API_URL, IDEMD_MAX_ATTEMPTS).
type Command struct {
	config.Common `embed:""`
	Settings      `embed:""`
	// Stats are the database-wide gauges' exporter's flags (--db-stats-*):
	// the long-running completer, the daemon that always runs, also runs
	// internal/dbstats, one replica at a time exporting.
	Stats dbstats.Settings `embed:""`

	AuthSecretFile         string `name:"auth-secret-file" help:"File holding the current replay signing secret (>= 32 bytes). Required."`
	AuthSecretFilePrevious string `name:"auth-secret-file-previous" help:"File holding the previous secret during a rotation; replays are then signed with both."`
	Once                   bool   `name:"once" help:"Do one pass (claim and process batches until no key is due right now) and exit 0."`
}

// CommonConfig implements daemon.Command.
func (c *Command) CommonConfig() *config.Common { return &c.Common }

// LongRunning implements daemon.Command: without --once the completer runs
// until SIGTERM and serves /metrics on the default address.
func (c *Command) LongRunning() bool { return !c.Once }

// OldestSchema implements daemon.SchemaFloor.
func (c *Command) OldestSchema() int64 { return OldestSchema }

// OldestSchema is the lowest idemd migration the completer runs on:
// 00019_idempotency_keys_completer_replayed_at.sql, the column its
// candidates and failed attempts use (sql.go); it also needs
// idemd_reaper_runs (00016, whose run history the database-wide exporter
// it runs, internal/dbstats, reads), idempotency_key_reviews (00004),
// idemd_leases (00011, the exporter's lease) and idemd_unfinished_keys
// (00012, its candidates).
const OldestSchema = 19

// FlagDefaults implements config.Defaulter: the flags' defaults are
// DefaultSettings and the exporter's dbstats.DefaultSettings, embedded as
// in Command.
func (c *Command) FlagDefaults() any {
	return struct {
		Settings `embed:""`
		Stats    dbstats.Settings `embed:""`
	}{DefaultSettings(), dbstats.DefaultSettings()}
}

// Check reports every problem with the flags at once (exit 2), including
// unreadable or too-short secret files. It never prints a secret.
func (c *Command) Check() []string {
	p := append(c.Common.Check(), c.Settings.Check()...)
	p = append(p, c.Stats.Check()...)
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

// Run does one pass (--once), or runs until SIGTERM: then the database-wide
// gauges' exporter (internal/dbstats) runs beside the service, started
// before it and stopped after it, both within --shutdown-timeout.
func (c *Command) Run(ctx context.Context, env *daemon.Env) error {
	secrets, err := replayauth.ReadSecretFiles(c.AuthSecretFile, c.AuthSecretFilePrevious)
	if err != nil {
		return &config.Error{Problems: []string{err.Error()}}
	}
	signer, err := replayauth.NewSigner(secrets...)
	if err != nil {
		return &config.Error{Problems: []string{err.Error()}}
	}
	svc, err := New(Config{
		Settings: c.Settings,
		Pool:     env.Pool,
		Calls:    env.Calls,
		Signer:   signer,
		Logger:   env.Logger,
		Registry: env.Registry,
		Ready:    env.Ready,
	})
	if err != nil {
		return err
	}
	env.Logger.Info("completer starting",
		zap.String("api_url", redactURL(c.APIURL)), zap.Int("secrets", len(secrets)),
		zap.Bool("once", c.Once), zap.Int("concurrency", c.Concurrency), zap.Float64("rate", c.Rate))
	if c.Once {
		// The pass logged its summary line, or its failure; a pass with
		// nothing to say logged none, and --once says it ran: one line
		// either way.
		res, err := svc.RunOnce(ctx)
		if err == nil && !res.worthALine() {
			env.Logger.Info("completer pass", res.fields()...)
		}
		if err != nil && ctx.Err() == nil {
			return daemon.AlreadyLogged(err)
		}
		return nil
	}
	return c.runWithStats(ctx, env, svc)
}

// runWithStats runs the service until ctx ends with the exporter beside it:
// the exporter starts first and stops last, so the gauges cover the
// service's whole life; on ctx's end both stop within one
// --shutdown-timeout.
func (c *Command) runWithStats(ctx context.Context, env *daemon.Env, svc *Service) error {
	stats, err := dbstats.New(dbstats.Config{Settings: c.Stats, Pool: env.Pool, Calls: env.Calls, Logger: env.Logger, Registry: env.Registry})
	if err != nil {
		return err
	}
	return daemon.RunServices(ctx, c.ShutdownTimeout, stats, svc)
}
