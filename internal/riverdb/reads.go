package riverdb

// River's tables as idemd reads them, apart from the move: the exporter's
// job counts, the operator's job lookups, conformance's exactly-once
// check. Each query is its user's (the comment names it); its text is here
// because it knows River's schema and idemd's metadata keys.

// JobTable is River's job table, as idemctl names it in a listing and
// conformance checks it exists.
const JobTable = "river_job"

// LiveJobsSQL counts the live jobs by queue and state and finds each
// (queue, state)'s earliest scheduled_at. Its WHERE is on the leading
// column of River's river_job_prioritized_fetching_index (state, queue,
// priority, scheduled_at, id), which also holds every column it reads: the
// plan is a scan of the index's live-state ranges, never of the finalized
// rows (dbstats' TestStatsQueryPlan). @now replaces the database clock in tests.
const LiveJobsSQL = `
SELECT queue, state::text, count(*),
       extract(epoch FROM greatest(coalesce(@now::timestamptz, now()) - min(scheduled_at), interval '0'))::float8
FROM river_job
WHERE state IN ('available', 'pending', 'retryable', 'running', 'scheduled')
GROUP BY queue, state`

// JobsByMetadataSQL lists the River jobs whose metadata contains $1, through
// river_job_metadata_index (GIN).
const JobsByMetadataSQL = `
SELECT id, kind, state::text, queue, attempt::int, created_at, finalized_at,
       CASE WHEN jsonb_typeof(metadata->'` + MetadataStagedID + `') = 'number' THEN (metadata->>'` + MetadataStagedID + `')::bigint END, NULL::text
FROM river_job WHERE metadata @> $1::jsonb ORDER BY id LIMIT 100`

// stagedIDExpr is a River job's MetadataStagedID as a number; jobs
// without one are filtered by hasStagedID.
const (
	stagedIDExpr = `(metadata->>'` + MetadataStagedID + `')::bigint`
	hasStagedID  = `metadata ? '` + MetadataStagedID + `'`
)

// MaxStagedIDSQL is the highest staged id a River job carries (NULL when
// none): conformance's mark of the staged jobs before a run.
const MaxStagedIDSQL = `SELECT max(` + stagedIDExpr + `) FROM river_job WHERE ` + hasStagedID

// StagedIDsAboveSQL lists the staged ids above $1 that became River jobs:
// conformance's jobs of a run.
const StagedIDsAboveSQL = `SELECT ` + stagedIDExpr + ` FROM river_job
WHERE ` + hasStagedID + ` AND ` + stagedIDExpr + ` > $1`

// StagedIDsTwiceSQL lists the staged ids of $1 (bigint[]) that became
// more than one River job: conformance's exactly-once check.
const StagedIDsTwiceSQL = `SELECT ` + stagedIDExpr + ` FROM river_job
WHERE ` + hasStagedID + ` AND ` + stagedIDExpr + ` = ANY($1)
GROUP BY 1 HAVING count(*) > 1`
