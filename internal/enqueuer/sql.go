package enqueuer

import (
	"encoding/json"

	"github.com/jackc/pgx/v5"

	"github.com/idemd/idemd/internal/lowwater"
)

// The statements share their parameters' meanings, by name (pgx.NamedArgs):
//
//   - @from: the lowest staged id a statement looks at. Rows below it are
//     known not to need it: a drain's floor or its cursor (floor.go), the
//     sweep's low-water mark (sweep.go), or fullPass (math.MinInt64), below
//     every id. Every statement with @from walks staged_jobs_pkey from it,
//     never the dead entries below it (TestPlans).
//   - @batch_size: --batch-size, the most rows one move transaction takes.
//   - @seq: the oid of staged_jobs.id's sequence (the sweep's mark).
//
// The dead-letter insert names its parameters after the columns they fill.

// beginSQL begins every transaction that reads staged_jobs from @from (the
// moves, the sweep, the backlog gauges), so it walks the primary key from
// there even while an old snapshot keeps dead rows (lowwater.BeginSQL).
const beginSQL = lowwater.BeginSQL

// moveBeginSQL begins a move transaction: beginSQL, and a commit that does
// not wait for its WAL flush. Under a stream of commits the API's commits
// queue for the flush, and a move that queued with them would leave the
// rows it is about to take waiting a flush longer. It is safe for
// exactly-once because the move is one transaction: a server crash before
// the flush loses the whole move (the staged rows come back, their River
// jobs are gone), and nothing can act on a moved job before the flush:
// River's workers fetch a job in a transaction of their own that commits
// after the move, and waiting for that commit's flush (synchronous_commit
// on, PostgreSQL's default) flushes the move's commit record, which comes
// before it in the WAL, first.
const moveBeginSQL = beginSQL + `; SET LOCAL synchronous_commit = off`

// takeSQL takes up to @batch_size committed, unlocked rows with id >= @from
// in id order, deleting them and returning them in one statement. The rows
// are picked through staged_jobs_pkey from @from (an index scan whose
// condition is id >= @from) and deleted by the ctid the lock returned: a
// TID scan, so the delete neither walks the index again nor, whatever the
// planner believes about the table's size, scans the heap to join on id.
const takeSQL = `
DELETE FROM staged_jobs
WHERE ctid = ANY (ARRAY(
    SELECT ctid FROM staged_jobs WHERE id >= @from ORDER BY id LIMIT @batch_size FOR UPDATE SKIP LOCKED
))
RETURNING id, created_at, job_name, job_args, queue, priority,
          max_attempts, scheduled_at, tags, metadata, unique_key, unique_states`

func takeArgs(from int64, batchSize int) pgx.NamedArgs {
	return pgx.NamedArgs{"from": from, "batch_size": batchSize}
}

// backlogSQL counts the staged rows with id >= @from and finds the oldest
// created_at among them and its age by the database clock (0 when none),
// in one walk of staged_jobs_pkey from @from (an index scan whose
// condition is id >= @from, in a transaction begun with beginSQL).
const backlogSQL = `
SELECT count(*), min(created_at), coalesce(extract(epoch FROM now() - min(created_at)), 0)::float8
FROM staged_jobs WHERE id >= @from`

// sweepSeqSQL reads the id sequence: its oid, last value handed out (NULL
// when none yet) and cache size. No row: ids come from elsewhere.
const sweepSeqSQL = `
SELECT seq::oid, pg_sequence_last_value(seq), (SELECT seqcache FROM pg_sequence WHERE seqrelid = seq)
FROM (SELECT pg_get_serial_sequence('staged_jobs', 'id')::regclass AS seq) s
WHERE seq IS NOT NULL`

// sweepHoldersSQL lists the transactions holding (or waiting for) a lock on
// the sequence @seq, other than this one.
const sweepHoldersSQL = `
SELECT coalesce(array_agg(DISTINCT virtualtransaction), '{}')
FROM pg_locks
WHERE locktype = 'relation' AND relation = @seq::oid
  AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
  AND pid IS DISTINCT FROM pg_backend_pid()`

// sweepSQL is the plain read of the lowest committed id from @from: the
// first entry of staged_jobs_pkey from there (an index-only scan).
const sweepSQL = `SELECT min(id) FROM staged_jobs WHERE id >= @from`

// deadSQL dead-letters one taken row, keeping its id and columns.
const deadSQL = `
INSERT INTO staged_jobs_dead (id, created_at, job_name, job_args, queue, priority, max_attempts, scheduled_at, tags, metadata,
    unique_key, unique_states, reason)
VALUES (@id, @created_at, @job_name, @job_args, @queue, @priority, @max_attempts, @scheduled_at, @tags, @metadata,
    @unique_key, @unique_states, @reason)`

func deadArgs(d deadRow) pgx.NamedArgs {
	r := d.row
	return pgx.NamedArgs{
		"id": r.ID, "created_at": r.CreatedAt, "job_name": r.Kind, "job_args": json.RawMessage(r.Args),
		"queue": r.Queue, "priority": r.Priority, "max_attempts": r.MaxAttempts, "scheduled_at": r.ScheduledAt,
		"tags": r.Tags, "metadata": nullJSON(r.Metadata), "unique_key": r.UniqueKey, "unique_states": r.UniqueStates,
		"reason": d.why.Code + ": " + d.why.Detail,
	}
}
