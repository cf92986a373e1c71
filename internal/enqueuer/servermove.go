package enqueuer

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
)

// A move is one round trip: BEGIN, the session settings, one statement
// that takes the rows and writes their River jobs, and COMMIT, sent as one
// pipeline.
//
// On the two shared cores of the staging benchmark every round trip of a
// move is a wake-up of the enqueuer process and of its backend that waits
// for a core the API's backends hold; with the take, River's insert and the
// commit sent one after the other, those waits were most of a row's time
// from its commit to River (docs/benchmarks/enqueuer.md). Here the rows
// never leave the server: moveSQL deletes them and inserts their jobs into
// river_job as River's own insert does (JobInsertFastMany: the same
// columns, River's defaults for what the row leaves out, River's insert
// notification for the queues that got available jobs), which is the way
// River's clients in other languages insert jobs. Which rows it can move
// is decided in SQL by the same rules as validator.check; a batch with any
// row it would refuse moves nothing and goes to the Go path (moveBatch),
// which dead-letters that row with its reason, as does a batch River's
// table refuses (a CHECK constraint validation did not foresee).

// moveBegin is moveBeginSQL one statement at a time, as a pipeline sends
// them.
var moveBegin = strings.Split(moveBeginSQL, "; ")

// validSQL is validator.check in SQL, over a staged_jobs row: true when
// the enqueuer would move the row, false (never NULL) when it would
// dead-letter it. TestServerMoveValidatesAsGoDoes holds the two together.
const validSQL = `
coalesce(
    octet_length(job_name) BETWEEN 1 AND 127
    AND (@kinds::text[] IS NULL OR job_name = ANY (@kinds::text[]))
    AND octet_length(job_args::text) <= @max_args_bytes
    AND jsonb_typeof(job_args) = 'object'
    AND (queue IS NULL OR (octet_length(queue) <= 64 AND queue ~ '^[a-z0-9]+([_|-]?[a-z0-9]+)*$'))
    AND (priority IS NULL OR priority BETWEEN 1 AND 4)
    AND (max_attempts IS NULL OR max_attempts BETWEEN 1 AND 32767)
    AND (tags IS NULL OR coalesce(array_ndims(tags), 1) = 1)
    AND (tags IS NULL OR NOT EXISTS (
        SELECT FROM unnest(tags) t
        WHERE t IS NULL OR octet_length(t) > 255 OR t !~ '^[0-9A-Za-z_][0-9A-Za-z_-]+[0-9A-Za-z_]$'))
    AND (metadata IS NULL OR jsonb_typeof(metadata) = 'object')
    AND (scheduled_at IS NULL OR (isfinite(scheduled_at) AND scheduled_at >= @time_min AND scheduled_at < @time_max))
    AND isfinite(created_at) AND created_at >= @time_min AND created_at < @time_max
    AND (unique_key IS NULL) = (unique_states IS NULL)
    AND (unique_key IS NULL OR octet_length(unique_key) = @unique_key_len)
    AND (unique_states IS NULL OR (length(unique_states) = 8 AND (unique_states::integer & @unique_required) = @unique_required)),
false)`

// moveSQL takes up to @batch_size committed, unlocked rows with id >=
// @from, as takeSQL does, and when every one of them is valid and River's
// schema is still at @river_version deletes them and inserts their River
// jobs; otherwise it changes nothing. It reports the rows it locked, how
// many of those were invalid, whether River's version was @river_version,
// the jobs it wrote or found (River's unique jobs), how many of those
// were unique duplicates, the highest id locked, the ids below @gap_below
// (a count and the lowest) and the queues it sent River's insert
// notification for: those of available jobs, not in @quiet.
//
// The job columns are insertParams' and River's
// (TestServerMoveInsertsWhatRiverInserts). A unique job is inserted with
// River's own ON CONFLICT, so a job River's insert would have kept one of
// is kept once; of the rows in one batch with the same unique key the
// lowest id's is inserted and the others are duplicates of it, since one
// statement may not insert and then conflict on the same key. The jobs are
// inserted in unique-key order (the Go path's too: sortByUniqueKey), so
// replicas moving rows with keys in common take River's unique-key locks
// in one order and never deadlock.
// idemd_move_check (migration 00021) aborts the statement unless a job was
// written or found for every row deleted.
const moveSQL = `
WITH locked AS MATERIALIZED (
    SELECT ctid, id, ` + validSQL + ` AS ok
    FROM staged_jobs WHERE id >= @from ORDER BY id LIMIT @batch_size FOR UPDATE SKIP LOCKED
), gate AS MATERIALIZED (
    SELECT coalesce((SELECT max(version) FROM river_migration WHERE line = 'main') = @river_version, false) AS ok
), taken AS (
    DELETE FROM staged_jobs
    WHERE ctid = ANY (ARRAY(SELECT ctid FROM locked))
      AND (SELECT bool_and(ok) FROM locked) AND (SELECT ok FROM gate)
    RETURNING id, created_at, job_name, job_args, queue, priority, max_attempts,
        nullif(scheduled_at, @time_min) AS scheduled_at, tags, metadata, unique_key, unique_states
), firsts AS (
    SELECT * FROM (
        SELECT *, row_number() OVER (PARTITION BY unique_key ORDER BY id) AS nth FROM taken
    ) t WHERE unique_key IS NULL OR nth = 1
), jobs AS (
    INSERT INTO river_job (args, kind, max_attempts, metadata, priority, queue, scheduled_at, state, tags, unique_key, unique_states)
    SELECT job_args, job_name, coalesce(max_attempts, @default_max_attempts),
        coalesce(metadata, '{}') || jsonb_build_object(
            'idemd_staged_id', id,
            'idemd_staged_at', regexp_replace(to_char(created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US'), '\.?0+$', '') || 'Z'),
        coalesce(priority, @default_priority), coalesce(queue, @default_queue), coalesce(scheduled_at, now()),
        (CASE WHEN scheduled_at IS NULL THEN 'available' ELSE 'scheduled' END)::river_job_state,
        coalesce(tags, '{}'), unique_key, unique_states
    FROM firsts ORDER BY unique_key NULLS LAST, id
    ON CONFLICT (unique_key)
        WHERE unique_key IS NOT NULL AND unique_states IS NOT NULL AND river_job_state_in_bitmask(unique_states, state)
        DO UPDATE SET kind = river_job.kind
    RETURNING queue, state, xmax <> 0 AS duplicate
), written AS (
    SELECT idemd_move_check((SELECT count(*) FROM firsts), (SELECT count(*) FROM jobs)) AS n
), notified AS (
    SELECT queue, pg_notify(current_schema() || '.river_insert', json_build_object('queue', queue)::text)
    FROM (SELECT DISTINCT queue FROM jobs WHERE state = 'available' AND NOT duplicate) q
    WHERE NOT (queue = ANY (@quiet::text[]))
)
SELECT
    (SELECT count(*) FROM locked),
    (SELECT count(*) FROM locked WHERE NOT ok),
    (SELECT ok FROM gate),
    (SELECT n FROM written) + (SELECT count(*) FROM taken) - (SELECT count(*) FROM firsts),
    (SELECT count(*) FROM jobs WHERE duplicate) + (SELECT count(*) FROM taken) - (SELECT count(*) FROM firsts),
    (SELECT coalesce(max(id), 0) FROM locked),
    (SELECT count(*) FROM locked WHERE id < @gap_below),
    (SELECT coalesce(min(id), 0) FROM locked WHERE id < @gap_below),
    (SELECT coalesce(array_agg(queue), '{}') FROM notified)`

// serverMoveResult is what one moveSQL did.
type serverMoveResult struct {
	locked, invalid int
	// riverCurrent: River's schema was at the version the move was told;
	// when false the move changed nothing.
	riverCurrent bool
	// moved counts the rows that became River jobs or were duplicates of
	// a unique job (duplicates, also counted apart).
	moved, duplicates int
	last              int64
	gaps              int
	lowestGap         int64
	notified          []string
}

// moveInServer runs one move in one round trip. A batch with an invalid
// row comes back with invalid > 0 and nothing moved; an error that River's
// table raised for a row's data is errRiverRejected.
//
// The whole move, from the pool's acquire to COMMIT, is one call bounded
// by --database-timeout: a batch takes well under a second
// (docs/operations.md, "Sizing"), and one the database does not answer
// is abandoned (its connection closed, the server rolls it back) and
// retried on another connection.
func (s *Service) moveInServer(ctx context.Context, from, gapBelow int64, riverVersion int) (res serverMoveResult, err error) {
	err = s.calls.Do(ctx, batchOp, func(ctx context.Context) (err error) {
		res, err = s.moveInServerOnce(ctx, from, gapBelow, riverVersion)
		return err
	})
	return res, err
}

func (s *Service) moveInServerOnce(ctx context.Context, from, gapBelow int64, riverVersion int) (res serverMoveResult, err error) {
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return res, fmt.Errorf("enqueuer batch: acquire: %w", err)
	}
	// A failed pipeline leaves the transaction open (aborted, or not yet
	// committed): roll it back, and if that fails too the pool closes a
	// connection it gets back in a transaction.
	defer func() {
		if err != nil {
			cctx, cancel := s.calls.Cleanup(ctx)
			conn.Exec(cctx, "ROLLBACK") //nolint:errcheck // the error is err
			cancel()
		}
		conn.Release()
	}()
	b := &pgx.Batch{}
	for _, q := range moveBegin {
		b.Queue(q)
	}
	b.Queue(moveSQL, s.moveArgs(from, gapBelow, riverVersion))
	b.Queue("COMMIT")
	br := conn.SendBatch(ctx, b)
	defer func() {
		if cerr := br.Close(); cerr != nil && err == nil {
			err = fmt.Errorf("enqueuer batch: move: %w", cerr)
		}
	}()
	for range moveBegin {
		if _, err := br.Exec(); err != nil {
			return res, fmt.Errorf("enqueuer batch: begin: %w", err)
		}
	}
	if err := br.QueryRow().Scan(&res.locked, &res.invalid, &res.riverCurrent, &res.moved, &res.duplicates, &res.last, &res.gaps, &res.lowestGap, &res.notified); err != nil {
		if isDataError(err, conn.Conn()) {
			return res, fmt.Errorf("enqueuer batch: %w: %w", errRiverRejected, err)
		}
		return res, fmt.Errorf("enqueuer batch: move: %w", err)
	}
	tag, err := br.Exec()
	if err != nil {
		return res, fmt.Errorf("enqueuer batch: commit: %w", err)
	}
	if tag.String() != "COMMIT" {
		return res, fmt.Errorf("enqueuer batch: commit: %w", pgx.ErrTxCommitRollback)
	}
	s.notices.sent(res.notified, time.Now())
	return res, nil
}

func (s *Service) moveArgs(from, gapBelow int64, riverVersion int) pgx.NamedArgs {
	var kinds []string // nil: NULL, any kind
	if s.valid.allowed != nil {
		kinds = s.cfg.AllowedKinds
	}
	return pgx.NamedArgs{
		"from": from, "batch_size": s.cfg.BatchSize, "gap_below": gapBelow,
		"kinds": kinds, "max_args_bytes": s.cfg.MaxArgsBytes,
		"default_max_attempts": river.MaxAttemptsDefault,
		"default_priority":     river.PriorityDefault,
		"default_queue":        river.QueueDefault,
		"quiet":                s.notices.quiet(time.Now()),
		"river_version":        riverVersion,
		"time_min":             timeMin,
		"time_max":             timeMax,
		"unique_key_len":       uniqueKeyLen,
		"unique_required":      int32(uniqueRequired),
	}
}

// insertNotices limits River's insert notifications as River's own client
// does: at most one a queue per river.FetchCooldownDefault, the interval
// River's producers wait between fetches anyway.
type insertNotices struct {
	mu   sync.Mutex
	last map[string]time.Time
}

// quiet lists the queues notified less than the cooldown before now.
func (n *insertNotices) quiet(now time.Time) []string {
	n.mu.Lock()
	defer n.mu.Unlock()
	q := []string{}
	for queue, at := range n.last {
		if now.Sub(at) < river.FetchCooldownDefault {
			q = append(q, queue)
		} else {
			delete(n.last, queue)
		}
	}
	return q
}

func (n *insertNotices) sent(queues []string, now time.Time) {
	if len(queues) == 0 {
		return
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.last == nil {
		n.last = make(map[string]time.Time)
	}
	for _, q := range queues {
		n.last[q] = now
	}
}
