package completer

// The statements share their parameters' meanings, by name (pgx.NamedArgs):
//
//   - @key_id, @tracked_at: a key's id and the created_at its row in
//     idemd_unfinished_keys is tracked under;
//   - @leased_until: the lease the claim gave us; every write after a claim
//     checks it, so a replica whose lease was taken over writes nothing;
//   - @batch_size, @grace, @idle, @lock_timeout: the candidate query's limit
//     and --grace, --idle, --lock-timeout;
//   - @from_at, @from_id: the low-water mark a walk of
//     idemd_unfinished_keys starts at (mark.go);
//   - @lease, @give_up_after, @in_progress_delay: --lease, --give-up-after,
//     --in-progress-delay.
//
// The database clock decides every age.

// unfinished is what keeps a key the completer's business: not finished
// and not given up. Every statement that asks whether a key is still to be
// completed composes it. It names idempotency_keys' columns unqualified,
// so it goes where idempotency_keys is the only table in scope with those
// columns (idemd_unfinished_keys has neither). Migration 00012's trigger
// and backfill, which fill idemd_unfinished_keys, state the same
// condition in SQL.
const unfinished = `recovery_point <> 'finished' AND completer_gave_up_at IS NULL`

// candidateConditions is what makes a key due: unfinished, not given up,
// past the grace period, idle, not locked by a live request, its next
// attempt due, not leased. Idle means no run since --idle ago, or none
// since the completer wrote its last failed replay (completer_replayed_at):
// the API sets last_run_at on the completer's replays too, and a replay
// that conflicted must be retried after its backoff, not --idle later. u is its idemd_unfinished_keys row, c its
// idempotency_keys row; the row's own columns decide, the tracked
// created_at only orders the walk and bounds it.
const candidateConditions = `u.created_at < now() - @grace::interval
      AND ` + unfinished + `
      AND c.created_at < now() - @grace::interval
      AND (c.last_run_at < now() - @idle::interval OR c.last_run_at <= c.completer_replayed_at)
      AND (c.locked_at IS NULL OR c.locked_at < now() - @lock_timeout::interval)
      AND (c.completer_next_attempt_at IS NULL OR c.completer_next_attempt_at <= now())
      AND (c.completer_leased_until IS NULL OR c.completer_leased_until < now())`

// candidateSQL selects up to @batch_size due candidates (their id and the
// created_at they are tracked under) in claim order.
//
// It indexes nothing the API updates (migrations.APIUpdatedColumns): it
// walks idemd_unfinished_keys, which a trigger fills when a key is inserted
// unfinished and the completer empties of keys that finished, were given
// up or deleted (untrackSQL, Prune), in its primary key's (created_at,
// key_id) order, up to the grace period, and checks each key's row through
// the primary key of idempotency_keys. Its cost follows the backlog, not
// the table (TestCandidatePlan).
//
// This is the walk from the start of the index, as internal/bench/completer
// copies and times it; the completer runs candidateFromSQL, the same walk
// started at the low-water mark.
const candidateSQL = candidateHead + candidateConditions + candidateTail

// candidateFromSQL is candidateSQL started at the low-water mark
// (@from_at, @from_id) (mark.go): the walk of the primary key begins
// there, past the entries of rows deleted below it that an old snapshot
// keeps.
const candidateFromSQL = candidateHead + markCondition + `
      AND ` + candidateConditions + candidateTail

// markCondition starts a walk of idemd_unfinished_keys u at the
// low-water mark (@from_at, @from_id), an index condition on its primary
// key.
const markCondition = `(u.created_at, u.key_id) >= (@from_at::timestamptz, @from_id::bigint)`

const (
	candidateHead = `
    SELECT c.id, u.created_at AS tracked_at
    FROM idemd_unfinished_keys u
    JOIN idempotency_keys c ON c.id = u.key_id
    WHERE `
	candidateTail = `
    ORDER BY u.created_at, u.key_id
    LIMIT @batch_size`
)

// candidateLocking locks the candidates a claim selects, skipping rows
// another replica or the API holds.
const candidateLocking = `
    FOR UPDATE OF c SKIP LOCKED`

// claimedColumns is what a claim returns of each key it leased.
const claimedColumns = `k.id, k.user_id, k.idempotency_key, k.request_method, k.request_path,
          k.request_params, k.completer_attempts, k.completer_leased_until,
          k.created_at + @give_up_after::interval <= now() AS past_horizon, cand.tracked_at`

// claimSQL leases the candidates in the same statement that selects them,
// so two replicas can never both lease a key.
const claimSQL = `
UPDATE idempotency_keys k
SET completer_leased_until = now() + @lease::interval
FROM (` + candidateFromSQL + candidateLocking + `) cand
WHERE k.id = cand.id
RETURNING ` + claimedColumns

// claimOneSQL is claimSQL restricted to one key (@key_id, tracked under
// @tracked_at), so the half-open probe is the key chooseProbes picked,
// leased under exactly the conditions of a batch claim (it is skipped if it
// stopped being due or another replica took it). The tracked created_at
// makes it one primary-key lookup in idemd_unfinished_keys, not a walk of
// the backlog.
const claimOneSQL = `
UPDATE idempotency_keys k
SET completer_leased_until = now() + @lease::interval
FROM (
    SELECT c.id, u.created_at AS tracked_at
    FROM idemd_unfinished_keys u
    JOIN idempotency_keys c ON c.id = u.key_id
    WHERE u.created_at = @tracked_at::timestamptz AND u.key_id = @key_id AND c.id = @key_id
      AND ` + candidateConditions + candidateLocking + `) cand
WHERE k.id = cand.id
RETURNING ` + claimedColumns

// probeCandidatesSQL lists up to @batch_size due candidates (candidateSQL
// without locking: nothing is leased yet) with their attempts, in claim
// order. It walks the same rows a batch claim would, once per half-open.
const probeCandidatesSQL = `
SELECT cand.id, k.completer_attempts, cand.tracked_at
FROM (` + candidateFromSQL + `) cand
JOIN idempotency_keys k ON k.id = cand.id
ORDER BY cand.tracked_at, cand.id`

// rereadSQL reads what a replay left of the key: its recovery point,
// whether it is finished, whether our lease still holds, whether it is
// past the give-up horizon, whether the API holds it locked (as the API
// itself decides "in progress": locked_at younger than its lock
// timeout). No row: the key is gone.
const rereadSQL = `
SELECT recovery_point, recovery_point = 'finished',
       completer_leased_until IS NOT DISTINCT FROM @leased_until,
       created_at + @give_up_after::interval <= now(),
       locked_at IS NOT NULL AND locked_at > now() - @lock_timeout::interval
FROM idempotency_keys WHERE id = @key_id`

// untrackSQL deletes a key's row from idemd_unfinished_keys once the key is
// finished, given up or gone: none of those ever becomes a candidate again.
const untrackSQL = `DELETE FROM idemd_unfinished_keys WHERE created_at = @tracked_at AND key_id = @key_id`

// finishedSQL clears our bookkeeping on a finished key and stops tracking
// it.
const finishedSQL = `
WITH untracked AS (` + untrackSQL + `)
UPDATE idempotency_keys SET completer_leased_until = NULL, completer_next_attempt_at = NULL
WHERE id = @key_id AND completer_leased_until = @leased_until`

// releaseSQL hands a key back without counting an attempt.
const releaseSQL = `
UPDATE idempotency_keys SET completer_leased_until = NULL
WHERE id = @key_id AND completer_leased_until = @leased_until`

// inProgressSQL leaves a key a live request holds (409) for
// @in_progress_delay, counting no attempt.
const inProgressSQL = `
UPDATE idempotency_keys
SET completer_leased_until = NULL, completer_next_attempt_at = now() + @in_progress_delay::interval
WHERE id = @key_id AND completer_leased_until = @leased_until AND recovery_point <> 'finished'`

// attemptSQL records a failed attempt (@attempts, @last_error) and when to
// retry: after @retry_in, but never later than the give-up horizon, so
// giving up is not delayed by a long backoff.
const attemptSQL = `
UPDATE idempotency_keys
SET completer_attempts = @attempts,
    completer_last_error = @last_error,
    completer_next_attempt_at = LEAST(now() + @retry_in::interval, created_at + @give_up_after::interval),
    completer_replayed_at = now(),
    completer_leased_until = NULL
WHERE id = @key_id AND completer_leased_until = @leased_until AND recovery_point <> 'finished'`

// giveUpSQL gives up on a key (its review is flagged in the same
// transaction); an empty @last_error keeps the one recorded before.
const giveUpSQL = `
UPDATE idempotency_keys
SET completer_gave_up_at = now(), completer_leased_until = NULL, completer_attempts = @attempts,
    completer_last_error = COALESCE(NULLIF(@last_error, ''), completer_last_error)
WHERE id = @key_id AND completer_leased_until = @leased_until AND ` + unfinished

// pruneSQL walks up to @walk rows of idemd_unfinished_keys after the cursor
// (@cursor_at, @cursor_id) and deletes those whose key is finished, given
// up or gone (finished by the API itself, or reaped). It returns how many
// it walked and deleted, and the cursor to continue from.
const pruneSQL = `
WITH walked AS (
    SELECT u.created_at, u.key_id,
           k.id IS NULL OR NOT (` + unfinished + `) AS done
    FROM idemd_unfinished_keys u
    LEFT JOIN idempotency_keys k ON k.id = u.key_id
    WHERE (u.created_at, u.key_id) > (@cursor_at::timestamptz, @cursor_id::bigint)
    ORDER BY u.created_at, u.key_id
    LIMIT @walk
),
pruned AS (
    DELETE FROM idemd_unfinished_keys u
    USING walked w
    WHERE w.done AND u.created_at = w.created_at AND u.key_id = w.key_id
    RETURNING 1
),
last AS (
    SELECT created_at, key_id FROM walked ORDER BY created_at DESC, key_id DESC LIMIT 1
)
SELECT (SELECT count(*) FROM walked), (SELECT count(*) FROM pruned),
       COALESCE((SELECT created_at FROM last), @cursor_at), COALESCE((SELECT key_id FROM last), @cursor_id)`

// markSQL reads a pass's low-water mark (mark.go): the bound
// now() - @grace - @margin, the lowest tracked row at or above
// (@from_at, @from_id) (a plain read: rows others hold locked count), and
// how many unfinished keys are tracked below (@below_at, @below_id) (an
// empty range unless the read is a full one from the start).
const markSQL = `
SELECT now() - @grace::interval - @margin::interval, l.created_at, l.key_id,
       (SELECT count(*)
        FROM idemd_unfinished_keys u
        JOIN idempotency_keys k ON k.id = u.key_id
        WHERE (u.created_at, u.key_id) < (@below_at::timestamptz, @below_id::bigint)
          AND ` + unfinished + `)
FROM (SELECT 1) one
LEFT JOIN LATERAL (
    SELECT u.created_at, u.key_id
    FROM idemd_unfinished_keys u
    WHERE ` + markCondition + `
    ORDER BY u.created_at, u.key_id
    LIMIT 1
) l ON true`

// unfinishedKeysSQL counts the completer's backlog by recovery point: keys
// unfinished and not given up, with the created_at of the oldest and its
// age by the database clock. It walks only idemd_unfinished_keys (every
// unfinished key is in it) from the position (@from_at, @from_id) on, and
// the primary key of idempotency_keys. In a transaction begun with
// lowwater.BeginSQL the walk goes through the side table's primary key from
// that position, so from the low-water mark it skips the dead entries a
// held snapshot keeps below it (mark.go).
const unfinishedKeysSQL = `
SELECT k.recovery_point, count(*), min(k.created_at), EXTRACT(EPOCH FROM now() - min(k.created_at))::float8
FROM idemd_unfinished_keys u
JOIN idempotency_keys k ON k.id = u.key_id
WHERE (u.created_at, u.key_id) >= (@from_at::timestamptz, @from_id::bigint)
  AND ` + unfinished + `
GROUP BY k.recovery_point
ORDER BY k.recovery_point`
