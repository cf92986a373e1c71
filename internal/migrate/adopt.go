package migrate

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemd/idemd/internal/backoff"
	"github.com/idemd/idemd/internal/dbcall"
)

// Adoption of the article's schema (docs/operations.md, "Adopting a
// database that has the article's schema"): idempotency_keys.response_body
// is JSONB there, so a replay is PostgreSQL's text of the JSONB value
// rather than the body the API wrote. AdoptArticleSchema turns the column
// into idemd's TEXT online, in four steps, each safe to interrupt and
// resumed by running it again:
//
//  1. prepare: one short transaction adds the nullable column
//     AdoptColumn (a catalogue change, no rewrite) and a trigger that
//     fills it from response_body on every INSERT and every UPDATE of
//     response_body, so from its commit on every write keeps the two equal;
//  2. backfill: batches of BatchSize rows by primary key, each its own
//     short transaction, copy response_body::text into AdoptColumn where
//     they differ, with Pause between batches;
//  3. verify: one read of the table (no lock beyond a plain SELECT's)
//     checks that no row's copy differs;
//  4. swap: one short transaction drops the trigger and response_body and
//     renames AdoptColumn to response_body: catalogue changes only.
//
// Steps 1 and 4 take the table's ACCESS EXCLUSIVE lock for milliseconds.
// They wait for it at most LockTimeout (lock_timeout), so the API's
// statements queued behind the wait are held at most that long, and retry
// until LockWait has passed. Every stored body keeps the text it was
// replayed with (the JSONB's text); bodies written after the swap are
// stored byte for byte.

// AdoptColumn is the column step 1 adds and step 4 renames to
// response_body.
const AdoptColumn = "idemd_response_body_text"

// adoptTrigger (and its function) keep AdoptColumn equal to response_body
// between steps 1 and 4.
const adoptTrigger = "idemd_adopt_response_body"

// AdoptOptions tune AdoptArticleSchema. The zero value is usable.
type AdoptOptions struct {
	// BatchSize is the rows one backfill transaction covers (1000 when
	// zero).
	BatchSize int
	// Pause between backfill batches (none when zero), to leave I/O and
	// autovacuum room on a busy database.
	Pause time.Duration
	// LockTimeout bounds each wait for the table's lock in steps 1 and 4
	// (2s when zero): how long the API's statements may queue behind it.
	LockTimeout time.Duration
	// LockWait is how long steps 1 and 4 keep retrying a lock that timed
	// out (5m when zero).
	LockWait time.Duration
	// MigrateLockTimeout bounds the wait for a concurrent `idemctl
	// migrate` (5m when zero).
	MigrateLockTimeout time.Duration
	Logger             *slog.Logger
	// Calls bounds the calls for the migration lock (Options.Calls).
	Calls *dbcall.Bounds
}

// AdoptResult says what AdoptArticleSchema did.
type AdoptResult struct {
	// From is response_body's type before the run: "jsonb" or "json",
	// or "text" when the database already had idemd's schema and nothing
	// was done.
	From string
	// Resumed is true when an earlier, interrupted run had done step 1.
	Resumed bool
	// Backfilled is how many rows step 2 copied, in Batches batches.
	Backfilled int64
	Batches    int
	// LockAttempts counts the lock waits of steps 1 and 4, retries
	// included.
	LockAttempts int
}

// ErrAdoptBlocked is returned (wrapped, with the objects named) when
// something other than idemd depends on response_body (a view, an index, a
// constraint): the swap would drop it. Adapt or drop it, then run again.
var ErrAdoptBlocked = errors.New("migrate: adopt: response_body is used by other objects")

// ResponseBodyType returns the type of idempotency_keys.response_body:
// "text" on idemd's schema, "jsonb" on the article's ("" when the table or
// the column is missing).
func ResponseBodyType(ctx context.Context, q interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}) (string, error) {
	var typ *string
	err := q.QueryRow(ctx, `SELECT (SELECT t.typname FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid
		WHERE a.attrelid = to_regclass('idempotency_keys') AND a.attname = 'response_body'
		  AND a.attnum > 0 AND NOT a.attisdropped)`).Scan(&typ)
	if err != nil {
		return "", fmt.Errorf("migrate: read response_body's type: %w", err)
	}
	if typ == nil {
		return "", nil
	}
	return *typ, nil
}

// AdoptArticleSchema moves a database with the article's response_body
// (JSONB, or JSON) to idemd's TEXT, online (see AdoptColumn's package
// comment for the steps and their locks). It holds the migration lock
// (LockKey) throughout, so it never runs beside `idemctl migrate` or
// another adoption. On a database that already has TEXT it does nothing
// (From "text"). The caller must be the table's owner (idemd_migrator).
func AdoptArticleSchema(ctx context.Context, pool *pgxpool.Pool, opts AdoptOptions) (*AdoptResult, error) {
	if opts.BatchSize <= 0 {
		opts.BatchSize = 1000
	}
	if opts.LockTimeout <= 0 {
		opts.LockTimeout = 2 * time.Second
	}
	if opts.LockWait <= 0 {
		opts.LockWait = 5 * time.Minute
	}
	if opts.MigrateLockTimeout <= 0 {
		opts.MigrateLockTimeout = 5 * time.Minute
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	release, err := holdLock(ctx, pool, opts.MigrateLockTimeout, opts.Calls)
	if err != nil {
		return nil, err
	}
	defer release()

	res := &AdoptResult{}
	if res.From, err = ResponseBodyType(ctx, pool); err != nil {
		return nil, err
	}
	switch res.From {
	case "":
		return nil, errors.New("migrate: adopt: idempotency_keys.response_body does not exist; run `idemctl migrate` first")
	case "text":
		log.Info("adopt: response_body is already TEXT (idemd's schema); nothing to do")
		return res, nil
	case "jsonb", "json":
	default:
		return nil, fmt.Errorf("migrate: adopt: response_body is %s; only the article's jsonb (or json) is adopted", res.From)
	}
	if err := checkDependents(ctx, pool); err != nil {
		return nil, err
	}
	if err := pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_attribute
		WHERE attrelid = 'idempotency_keys'::regclass AND attname = $1 AND NOT attisdropped)`, AdoptColumn).Scan(&res.Resumed); err != nil {
		return nil, fmt.Errorf("migrate: adopt: %w", err)
	}

	// Step 1.
	log.Info("adopt: step 1/4: add "+AdoptColumn+" and the trigger that keeps it equal to response_body", "resumed", res.Resumed)
	if err := withTableLock(ctx, pool, opts, res, log, "prepare", func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `
ALTER TABLE idempotency_keys ADD COLUMN IF NOT EXISTS `+AdoptColumn+` TEXT;
CREATE OR REPLACE FUNCTION `+adoptTrigger+`() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    -- idemctl migrate --adopt-article-schema: keeps the TEXT copy of
    -- response_body equal to it until the swap (docs/operations.md).
    NEW.`+AdoptColumn+` := NEW.response_body::text;
    RETURN NEW;
END $$;
CREATE OR REPLACE TRIGGER `+adoptTrigger+` BEFORE INSERT OR UPDATE OF response_body ON idempotency_keys
    FOR EACH ROW EXECUTE FUNCTION `+adoptTrigger+`();`)
		return err
	}); err != nil {
		return res, err
	}

	// Step 2. Every row inserted after step 1 has its copy from the trigger
	// (CREATE TRIGGER waited for every writer before it), so the rows to
	// copy are at most the ones up to today's highest id.
	var hi *int64
	if err := pool.QueryRow(ctx, `SELECT max(id) FROM idempotency_keys`).Scan(&hi); err != nil {
		return res, fmt.Errorf("migrate: adopt: %w", err)
	}
	if hi != nil {
		log.Info("adopt: step 2/4: backfill", "up_to_id", *hi, "batch_size", opts.BatchSize)
		if err := backfill(ctx, pool, opts, *hi, res, log); err != nil {
			return res, err
		}
	}

	// Step 3.
	log.Info("adopt: step 3/4: verify")
	var differ int64
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM idempotency_keys
		WHERE `+AdoptColumn+` IS DISTINCT FROM response_body::text`).Scan(&differ); err != nil {
		return res, fmt.Errorf("migrate: adopt: verify: %w", err)
	}
	if differ > 0 {
		return res, fmt.Errorf("migrate: adopt: verify: %d rows' %s differs from response_body (is trigger %s disabled?); nothing was swapped, run again", differ, AdoptColumn, adoptTrigger)
	}

	// Step 4.
	log.Info("adopt: step 4/4: swap")
	if err := withTableLock(ctx, pool, opts, res, log, "swap", func(tx pgx.Tx) error {
		// Under the lock, again: nothing may have come to depend on the
		// column since the check above.
		if err := checkDependents(ctx, tx); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `
DROP TRIGGER `+adoptTrigger+` ON idempotency_keys;
DROP FUNCTION `+adoptTrigger+`();
ALTER TABLE idempotency_keys DROP COLUMN response_body;
ALTER TABLE idempotency_keys RENAME COLUMN `+AdoptColumn+` TO response_body;`)
		return err
	}); err != nil {
		return res, err
	}
	log.Info("adopt: done: response_body is TEXT", "backfilled", res.Backfilled, "batches", res.Batches)
	return res, nil
}

// checkDependents refuses when anything but the adoption's own trigger
// depends on response_body: dropping the column would drop it, or fail.
func checkDependents(ctx context.Context, q interface {
	Query(context.Context, string, ...any) (pgx.Rows, error)
}) error {
	rows, err := q.Query(ctx, `
SELECT pg_describe_object(d.classid, d.objid, d.objsubid)
FROM pg_depend d
JOIN pg_attribute a ON a.attrelid = d.refobjid AND a.attnum = d.refobjsubid
WHERE d.refclassid = 'pg_class'::regclass AND d.refobjid = 'idempotency_keys'::regclass
  AND a.attname = 'response_body' AND d.deptype IN ('n', 'a')
  AND NOT (d.classid = 'pg_trigger'::regclass
           AND d.objid IN (SELECT oid FROM pg_trigger WHERE tgname = $1 AND tgrelid = 'idempotency_keys'::regclass))
ORDER BY 1`, adoptTrigger)
	if err != nil {
		return fmt.Errorf("migrate: adopt: dependencies of response_body: %w", err)
	}
	deps, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return fmt.Errorf("migrate: adopt: dependencies of response_body: %w", err)
	}
	if len(deps) > 0 {
		return fmt.Errorf("%w: %s; drop or change them (they would be dropped with the JSONB column), then run again", ErrAdoptBlocked, strings.Join(deps, ", "))
	}
	return nil
}

// withTableLock runs fn in a transaction whose statements wait at most
// opts.LockTimeout for a lock, retrying a timed-out attempt until
// opts.LockWait has passed.
func withTableLock(ctx context.Context, pool *pgxpool.Pool, opts AdoptOptions, res *AdoptResult, log *slog.Logger, step string, fn func(pgx.Tx) error) error {
	deadline := time.Now().Add(opts.LockWait)
	for attempt := 1; ; attempt++ {
		res.LockAttempts++
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, fmt.Sprintf("SET LOCAL lock_timeout = %d", opts.LockTimeout.Milliseconds())); err != nil {
				return err
			}
			return fn(tx)
		})
		if err == nil {
			return nil
		}
		if !isLockTimeout(err) {
			return fmt.Errorf("migrate: adopt: %s: %w", step, err)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("migrate: adopt: %s: the table's lock was not granted within %s in %d attempts of %s (a long transaction holds it?); nothing was changed by this step, run again", step, opts.LockWait, attempt, opts.LockTimeout)
		}
		log.Warn("adopt: lock not granted in time; retrying", "step", step, "attempt", attempt, "lock_timeout", opts.LockTimeout)
		wait := backoff.Delay(attempt, lockRetryBase, lockRetryMax, nil)
		select {
		case <-ctx.Done():
			return fmt.Errorf("migrate: adopt: %s: %w", step, ctx.Err())
		case <-time.After(wait):
		}
	}
}

func isLockTimeout(err error) bool {
	var pg *pgconn.PgError
	return errors.As(err, &pg) && pg.Code == pgerrcode.LockNotAvailable
}

// backfillSQL copies one batch: the next BatchSize ids after $1 (up to
// $3), each row whose copy differs. It returns the batch's last id (NULL
// past the end) and how many rows it changed. A row an API transaction
// holds is waited for (at most the lock timeout), then copied as that
// transaction left it.
const backfillSQL = `
WITH batch AS (
    SELECT id FROM idempotency_keys WHERE id > $1 AND id <= $3 ORDER BY id LIMIT $2
), copied AS (
    UPDATE idempotency_keys k SET ` + AdoptColumn + ` = k.response_body::text
    FROM batch WHERE k.id = batch.id AND k.` + AdoptColumn + ` IS DISTINCT FROM k.response_body::text
    RETURNING 1
)
SELECT (SELECT max(id) FROM batch), (SELECT count(*) FROM copied)`

func backfill(ctx context.Context, pool *pgxpool.Pool, opts AdoptOptions, hi int64, res *AdoptResult, log *slog.Logger) error {
	after := int64(0)
	if err := pool.QueryRow(ctx, `SELECT coalesce(min(id), 1) - 1 FROM idempotency_keys`).Scan(&after); err != nil {
		return fmt.Errorf("migrate: adopt: backfill: %w", err)
	}
	lastLog := time.Now()
	for {
		var (
			last   *int64
			copied int64
		)
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, fmt.Sprintf("SET LOCAL lock_timeout = %d", opts.LockTimeout.Milliseconds())); err != nil {
				return err
			}
			return tx.QueryRow(ctx, backfillSQL, after, opts.BatchSize, hi).Scan(&last, &copied)
		})
		if isLockTimeout(err) {
			// A row of the batch is held by a long API transaction: the
			// batch is retried after the pause.
			log.Warn("adopt: backfill batch waited too long for a row; retrying", "after_id", after)
		} else if err != nil {
			return fmt.Errorf("migrate: adopt: backfill after id %d: %w", after, err)
		} else {
			res.Batches++
			res.Backfilled += copied
			if last == nil {
				return nil
			}
			after = *last
		}
		if time.Since(lastLog) > 10*time.Second {
			log.Info("adopt: backfill progress", "at_id", after, "of", hi, "copied", res.Backfilled)
			lastLog = time.Now()
		}
		pause := opts.Pause
		if err != nil {
			pause = max(pause, 100*time.Millisecond)
		}
		if pause > 0 {
			select {
			case <-ctx.Done():
				return fmt.Errorf("migrate: adopt: backfill: %w", ctx.Err())
			case <-time.After(pause):
			}
		}
	}
}
