package ctl

import (
	"context"
	"fmt"
	"time"

	"github.com/idemd/idemd/internal/config"
	"github.com/idemd/idemd/internal/logging"
	"github.com/idemd/idemd/internal/migrate"
)

// AdoptFlags are `idemctl migrate`'s flags for the explicit adoption of a
// database that has the article's schema (docs/operations.md, "Adopting a
// database that has the article's schema"). Embedded in MigrateCmd with
// the prefix "adopt-".
type AdoptFlags struct {
	ArticleSchema bool          `name:"article-schema" help:"After migrating, move idempotency_keys.response_body from the article's JSONB to idemd's TEXT online (new column, trigger, batched backfill, verify, then a catalogue-only swap; safe to interrupt and rerun). Without it, migrate only reports a JSONB column."`
	BatchSize     int           `name:"batch-size" default:"1000" help:"Rows per backfill transaction of --adopt-article-schema."`
	Pause         time.Duration `name:"pause" default:"10ms" help:"Pause between backfill batches of --adopt-article-schema."`
	LockTimeout   time.Duration `name:"lock-timeout" default:"2s" help:"Longest wait for the table's lock in --adopt-article-schema's two short exclusive steps (how long API statements may queue behind it); a timed-out wait is retried."`
	LockWait      time.Duration `name:"lock-wait" default:"5m" help:"How long --adopt-article-schema retries a lock that timed out before giving up."`
}

// articleSchemaHint is what a plain `idemctl migrate` prints on the
// article's schema (%s: the column's type). It names what the adoption
// requires of the API's code because the swap is what breaks an API that
// writes a JSON object into the column: Sequel's Hash becomes a condition
// on a TEXT column (TestAdoptArticleAPIWrites in internal/migrate).
const articleSchemaHint = "migrate: idempotency_keys.response_body is %s (the article's schema): replays are the stored JSON's text, not byte for byte.\n" +
	"migrate: an API written as the article's keeps working on this database as it is; nothing needs to change.\n" +
	"migrate: `idemctl migrate --adopt-article-schema` moves the column to TEXT online, for byte-for-byte replays. Change the API first: " +
	"it must write response_body as a JSON-encoded string (JSON.generate, json.dumps, JSON.stringify) in an untyped parameter, not a JSON object, " +
	"and read it as text; after the move, a JSON object written there fails (Sequel's Hash: PG::UndefinedColumn, in the last phase, after its upstream calls) " +
	"and a ::jsonb value is stored as the JSONB's text (docs/operations.md, \"Adopting a database that has the article's schema\")\n"

// run adopts when asked; otherwise it says so when the database still has
// the article's JSONB response_body, and changes nothing.
func (a *AdoptFlags) run(ctx context.Context, g *Globals, migrateLockTimeout time.Duration) error {
	if !a.ArticleSchema {
		typ, err := migrate.ResponseBodyType(ctx, g.Pool)
		if err != nil {
			return err
		}
		if typ == "jsonb" || typ == "json" {
			fmt.Fprintf(g.Stdout, articleSchemaHint, typ)
		}
		return nil
	}
	var problems []string
	if a.BatchSize <= 0 {
		problems = append(problems, fmt.Sprintf("--adopt-batch-size must be positive, got %d", a.BatchSize))
	}
	if a.Pause < 0 || a.LockTimeout <= 0 || a.LockWait <= 0 {
		problems = append(problems, "--adopt-pause must not be negative, --adopt-lock-timeout and --adopt-lock-wait must be positive")
	}
	if len(problems) > 0 {
		return &config.Error{Problems: problems}
	}
	// The adoption alters idemd's table as its owner, idemd_migrator,
	// whatever login role runs it (internal/migrate/owner.go).
	owner, err := migrate.OwnerPool(ctx, g.Pool, g.Pooler == config.PoolerTransaction, g.Calls)
	if err != nil {
		return err
	}
	defer owner.Close()
	res, err := migrate.AdoptArticleSchema(ctx, owner, migrate.AdoptOptions{
		BatchSize: a.BatchSize, Pause: a.Pause, LockTimeout: a.LockTimeout, LockWait: a.LockWait,
		MigrateLockTimeout: migrateLockTimeout, Logger: logging.Slog(g.Logger), Calls: g.Calls,
	})
	if err != nil {
		return err
	}
	if res.From == "text" {
		fmt.Fprintln(g.Stdout, "migrate: adopt: response_body is already TEXT; nothing to do")
		return nil
	}
	fmt.Fprintf(g.Stdout, "migrate: adopt: response_body moved from %s to TEXT (%d rows backfilled in %d batches, %d lock attempts%s)\n",
		res.From, res.Backfilled, res.Batches, res.LockAttempts, map[bool]string{true: ", resumed", false: ""}[res.Resumed])
	return nil
}
