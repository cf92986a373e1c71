package reaper

import "github.com/idemd/idemd/internal/review"

// The statements share one definition of an eligible key (the constant
// eligible), pasted into each as text rather than hidden in a view or a
// function, because PostgreSQL plans a statement as a whole:
//
//   - created_at < now - retention. The database clock decides (@now is
//     NULL in production; tests pin it to make the ±1 s boundary exact).
//     Strictly older: a key exactly at the horizon is kept.
//   - locked_at IS NULL or older than the lock window. The article sets
//     locked_at when a request takes the key and clears it when the request
//     returns, so a recent locked_at means a request is in flight. A request
//     that crashed leaves locked_at set forever; such a lock older than the
//     window (default 1 h, far above any request or API lock timeout) is
//     abandoned, and the key is reaped like any other (and flagged, since it
//     is unfinished).
//   - completer_leased_until not in the future: the completer is replaying
//     the key right now.
//
// The parameters are named (pgx.NamedArgs), one name per meaning in every
// statement (eligibilityArgs and batchArgs build them): @retention and
// @lock_window (intervals), @now (the pinned clock, or NULL), @unfinished
// and @gave_up (the review reasons of unfinished keys and of keys the
// completer gave up on); the batches add @batch_size (keys per batch),
// @flagged_by and @cursor_at, @cursor_id (created_at and id of the last key
// the previous batch took, or NULL); the plan adds @limit.

// A batch deletes up to @batch_size keys and copies the ones that need a
// human into idempotency_key_reviews in the same statement, so a key can
// never be deleted without its snapshot being kept.
//
// Batches walk the idempotency_keys_created_at index in (created_at, id)
// order from the cursor, so each starts where the previous one ended
// instead of wading through the index entries of the keys it just deleted
// (dead until vacuum), an idle pass is a single index probe, and a batch
// never exceeds @batch_size keys even when many keys share a created_at.
//
// There are three forms of a batch, sharing everything but how they pick
// the keys:
//
//   - rangeBatchSQL, the fast path: find the created_at of the
//     (@batch_size+1)-th key from the cursor (an index-only scan of the created_at index: no
//     heap visit, no sort), then DELETE every eligible key before it with a
//     plain range predicate. No row is locked before it is deleted, so each
//     key is written once. The batch can hold at most @batch_size keys,
//     since they all come before the (@batch_size+1)-th. When more than
//     @batch_size keys share the cursor's created_at, that range is empty;
//     the caller notices (nothing deleted, yet keys left) and redoes the
//     batch with:
//   - orderedBatchSQL: find the @batch_size-th eligible key in (created_at, id)
//     order, then DELETE every eligible key up to it. Its bound visits the
//     heap (for the eligibility) and sorts each run of equal created_at by
//     id: 9-10 ms per 30000 keys against the fast bound's 1.5 ms, measured
//     in psql on a fresh 2M-key table, so it is only the fallback.
//   - A key whose row lock another transaction holds (a request in flight)
//     makes either DELETE wait; the caller runs both under a short
//     lock_timeout, and on lock_not_available redoes the batch with
//     lockingBatchSQL: pick the ids with FOR UPDATE SKIP LOCKED, then delete
//     them. It steps around locked keys (the next run gets them) at the
//     price of a second write per key (the row lock) and a join.
//
// All end with the same columns: deleted, unprocessable, flagged
// (unfinished), flagged (gave up), the cursor to continue from (created_at,
// id; NULL when there is nothing after this batch), and whether more
// eligible keys may be left.
//
// A batch of a concurrent round (round.go) is a range batch whose end the
// round chose: @until, the next batch's start. Without it (NULL) the
// statement finds its own bound.
var rangeBatchSQL = `
WITH found AS (
    -- The created_at of the (@batch_size+1)-th key from the cursor,
    -- eligible or not (counting only eligible keys would need the heap).
    -- NULL when no more than @batch_size are left, and then this batch is
    -- the last. Not looked for when the round set the end.
    SELECT k.created_at
    FROM idempotency_keys k
    WHERE @until::timestamptz IS NULL
      AND ` + pastHorizon + `
      AND ` + fromCursorStart + `
    ORDER BY k.created_at
    OFFSET @batch_size::int
    LIMIT 1
),
bound AS (
    SELECT COALESCE(@until::timestamptz, (SELECT created_at FROM found)) AS created_at
),
deleted AS (
    DELETE FROM idempotency_keys k
    WHERE ` + eligibleFromCursor + `
      AND k.created_at < COALESCE((SELECT created_at FROM bound), 'infinity')
    RETURNING ` + deletedColumns + `
),` + reviewTail + `,
    -- The next batch starts at the bound's created_at, all its ids included.
    b.created_at, ` + minID + `, b.created_at IS NOT NULL
FROM counts c CROSS JOIN bound b`

// roundBoundsSQL finds where the batches of a concurrent round start: the
// created_at of the first key from the cursor, then the bound the range
// form would find from there (the created_at of the (@batch_size+1)-th
// key), then the bound it would find from that one, and so on, @width
// rows in all, or fewer when the keys past the horizon run out. So the
// round's batches are exactly those a sequential run would take, each at
// most @batch_size keys: an index-only scan of @batch_size entries per
// bound.
var roundBoundsSQL = `
WITH RECURSIVE bounds (i, created_at) AS (
    SELECT 0, (
        SELECT k.created_at
        FROM idempotency_keys k
        WHERE ` + pastHorizon + `
          AND ` + fromCursorStart + `
        ORDER BY k.created_at
        LIMIT 1)
    UNION ALL
    SELECT b.i + 1, (
        SELECT k.created_at
        FROM idempotency_keys k
        WHERE ` + pastHorizon + `
          AND k.created_at >= b.created_at
        ORDER BY k.created_at
        OFFSET @batch_size::int
        LIMIT 1)
    FROM bounds b
    WHERE b.i < @width::int - 1 AND b.created_at IS NOT NULL
)
SELECT created_at FROM bounds WHERE created_at IS NOT NULL ORDER BY i`

var orderedBatchSQL = `
WITH bound AS (
    -- The @batch_size-th eligible key from the cursor: the batch's
    -- inclusive end.
    -- NULL when fewer are left, and then this batch is the last.
    SELECT k.created_at, k.id
    FROM idempotency_keys k
    WHERE ` + eligibleFromCursor + `
    ORDER BY k.created_at, k.id
    OFFSET @batch_size::int - 1
    LIMIT 1
),
deleted AS (
    DELETE FROM idempotency_keys k
    WHERE ` + eligibleFromCursor + `
      -- created_at <= is what the index scan can stop at; the row
      -- comparison after it makes the end exact among equal created_at.
      AND k.created_at <= COALESCE((SELECT created_at FROM bound), 'infinity')
      AND (k.created_at, k.id) <= (COALESCE((SELECT created_at FROM bound), 'infinity'),
                                   COALESCE((SELECT id FROM bound), 9223372036854775807))
    RETURNING ` + deletedColumns + `
),` + reviewTail + `,
    b.created_at, b.id, b.id IS NOT NULL
FROM counts c LEFT JOIN bound b ON true`

// minID is below every id, so a cursor (t, minID) starts at all keys of
// created_at t.
const minID = `(-9223372036854775808)::bigint`

var lockingBatchSQL = `
WITH batch AS (
    SELECT k.id
    FROM idempotency_keys k
    WHERE ` + eligibleFromCursor + `
    ORDER BY k.created_at, k.id
    LIMIT @batch_size::int
    FOR UPDATE OF k SKIP LOCKED
),
deleted AS (
    DELETE FROM idempotency_keys k
    USING batch b
    WHERE k.id = b.id
    RETURNING ` + deletedColumns + `
),` + reviewTail + `,
    l.created_at, l.id, c.deleted >= @batch_size::int
FROM counts c
LEFT JOIN LATERAL (SELECT d.created_at, d.id FROM deleted d ORDER BY d.created_at DESC, d.id DESC LIMIT 1) l ON true`

// eligible is the definition of an eligible key (see the top of this
// file), shared by the batches and by the dry run's plan, so that a dry run
// reports exactly what a run would delete.
const eligible = pastHorizon + `
      AND (k.locked_at IS NULL OR k.locked_at < COALESCE(@now::timestamptz, now()) - @lock_window::interval)
      AND (k.completer_leased_until IS NULL OR k.completer_leased_until <= COALESCE(@now::timestamptz, now()))`

// pastHorizon: created before now - retention, by the database clock.
const pastHorizon = `k.created_at < COALESCE(@now::timestamptz, now()) - @retention::interval`

// fromCursorStart is what an index scan from the cursor can start at.
const fromCursorStart = `k.created_at >= COALESCE(@cursor_at::timestamptz, '-infinity')`

// eligibleFromCursor is an eligible key after the cursor. The row
// comparison alone would be enough; fromCursorStart beside it is what the
// index scan can start at.
const eligibleFromCursor = eligible + `
      AND ` + fromCursorStart + `
      AND (k.created_at, k.id) > (COALESCE(@cursor_at::timestamptz, '-infinity'), COALESCE(@cursor_id::bigint, ` + minID + `))`

// deletedColumns are all a DELETE returns per key: narrow, because
// RETURNING costs per row (the deleted tuple is fetched again and projected
// into the CTE's materialised result). Measured on a 30000-key batch in
// psql: the whole batch statement took 95-120 ms when the DELETE returned
// five columns and a snapshot expression, 55-85 ms with these four; the
// DELETE alone with no RETURNING took 50-57 ms. The flags say whether the
// key needs a review and for which reason, evaluated on the row version
// actually deleted.
const deletedColumns = `k.id, k.created_at,
              ` + needsReview + ` AS needs_review,
              k.completer_gave_up_at IS NOT NULL AS gave_up`

// reviewTail inserts the reviews and starts the final SELECT. The
// snapshot of a key to review is read by id: every part of a statement sees
// the same snapshot, so the row the DELETE removed is still there to read,
// as it was when the statement began (the deletion itself is decided on the
// latest version, so in the rare race where the row changed in between,
// the snapshot is one change older than the row deleted). Only the few
// keys that need a review are looked up. A key already flagged for the
// same reason (say the completer gave up and flagged it, or a human
// resolved that review) is not flagged again; the INSERT itself is
// package review's (review.FlagRowsSQL).
var reviewTail = `
needs_review AS MATERIALIZED (
    SELECT d.id AS key_id,
           -- A scalar subquery, not a join: it is always one primary-key
           -- probe per key to review, whatever the planner guesses the
           -- DELETE returns (as a join it was sometimes planned as a merge
           -- join walking the whole primary key from its start).
           (SELECT to_jsonb(k) FROM idempotency_keys k WHERE k.id = d.id) AS snapshot,
           CASE WHEN d.gave_up THEN @gave_up::text ELSE @unfinished::text END AS reason
    FROM deleted d
    WHERE d.needs_review
),
to_flag AS (
    SELECT n.key_id, n.snapshot, n.reason,
           'deleted by the reaper at the retention horizon at recovery point ' || (n.snapshot->>'recovery_point') AS detail,
           @flagged_by::text AS flagged_by
    FROM needs_review n
    WHERE NOT EXISTS (
        SELECT 1 FROM idempotency_key_reviews r
        WHERE r.key_id = n.key_id AND r.reason = n.reason
    )
),
flagged AS (` + review.FlagRowsSQL("to_flag") + `
),
counts AS (
    SELECT count(*) AS deleted, count(*) FILTER (WHERE needs_review) AS unprocessable FROM deleted
)
SELECT
    c.deleted, c.unprocessable,
    (SELECT count(*) FROM flagged WHERE reason = @unfinished::text),
    (SELECT count(*) FROM flagged WHERE reason = @gave_up::text)`

// needsReview says whether a key of idempotency_keys k needs a review when
// it is deleted: it never finished, or the completer gave up on it (the
// keys the completer still had to complete, and the ones it could not).
const needsReview = `(k.recovery_point <> 'finished' OR k.completer_gave_up_at IS NOT NULL)`

// reviewReason is the reason a key of idempotency_keys k would be flagged
// for, if it needs a review.
const reviewReason = `CASE WHEN k.completer_gave_up_at IS NOT NULL THEN @gave_up::text ELSE @unfinished::text END`

// planSQL counts what a run would do, without locking or changing anything:
// the dry run's report, the caps' pre-check and idemctl status (PlanRun).
// @limit bounds the keys counted (NULL: count all).
const planSQL = `
WITH eligible AS (
    SELECT k.id, k.created_at, ` + reviewReason + ` AS reason,
           ` + needsReview + ` AS needs_review
    FROM idempotency_keys k
    WHERE ` + eligible + `
    ORDER BY k.created_at
    LIMIT @limit::bigint
)
SELECT
    (SELECT count(*) FROM eligible),
    (SELECT count(*) FROM eligible e WHERE e.needs_review AND NOT EXISTS (
        SELECT 1 FROM idempotency_key_reviews r WHERE r.key_id = e.id AND r.reason = e.reason)),
    (SELECT min(created_at) FROM eligible)`

// planFlagsSQL lists the keys a dry run would flag, oldest first, @limit
// of them.
const planFlagsSQL = `
SELECT k.id, k.user_id, k.idempotency_key, k.recovery_point, k.created_at, ` + reviewReason + ` AS reason
FROM idempotency_keys k
WHERE ` + eligible + `
  AND ` + needsReview + `
  AND NOT EXISTS (
      SELECT 1 FROM idempotency_key_reviews r
      WHERE r.key_id = k.id AND r.reason = ` + reviewReason + `)
ORDER BY k.created_at
LIMIT @limit::bigint`
