WITH bound AS (
    -- The @batch_size-th eligible key from the cursor: the batch's
    -- inclusive end.
    -- NULL when fewer are left, and then this batch is the last.
    SELECT k.created_at, k.id
    FROM idempotency_keys k
    WHERE k.created_at < COALESCE(@now::timestamptz, now()) - @retention::interval
      AND (k.locked_at IS NULL OR k.locked_at < COALESCE(@now::timestamptz, now()) - @lock_window::interval)
      AND (k.completer_leased_until IS NULL OR k.completer_leased_until <= COALESCE(@now::timestamptz, now()))
      AND k.created_at >= COALESCE(@cursor_at::timestamptz, '-infinity')
      AND (k.created_at, k.id) > (COALESCE(@cursor_at::timestamptz, '-infinity'), COALESCE(@cursor_id::bigint, (-9223372036854775808)::bigint))
    ORDER BY k.created_at, k.id
    OFFSET @batch_size::int - 1
    LIMIT 1
),
deleted AS (
    DELETE FROM idempotency_keys k
    WHERE k.created_at < COALESCE(@now::timestamptz, now()) - @retention::interval
      AND (k.locked_at IS NULL OR k.locked_at < COALESCE(@now::timestamptz, now()) - @lock_window::interval)
      AND (k.completer_leased_until IS NULL OR k.completer_leased_until <= COALESCE(@now::timestamptz, now()))
      AND k.created_at >= COALESCE(@cursor_at::timestamptz, '-infinity')
      AND (k.created_at, k.id) > (COALESCE(@cursor_at::timestamptz, '-infinity'), COALESCE(@cursor_id::bigint, (-9223372036854775808)::bigint))
      -- created_at <= is what the index scan can stop at; the row
      -- comparison after it makes the end exact among equal created_at.
      AND k.created_at <= COALESCE((SELECT created_at FROM bound), 'infinity')
      AND (k.created_at, k.id) <= (COALESCE((SELECT created_at FROM bound), 'infinity'),
                                   COALESCE((SELECT id FROM bound), 9223372036854775807))
    RETURNING k.id, k.created_at,
              (k.recovery_point <> 'finished' OR k.completer_gave_up_at IS NOT NULL) AS needs_review,
              k.completer_gave_up_at IS NOT NULL AS gave_up
),
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
flagged AS (
INSERT INTO idempotency_key_reviews (key_id, user_id, idempotency_key, reason, detail, snapshot, flagged_by)
SELECT f.key_id, (f.snapshot->>'user_id')::bigint, f.snapshot->>'idempotency_key', f.reason, f.detail, f.snapshot, f.flagged_by
FROM to_flag f
ON CONFLICT (key_id, reason) WHERE resolved_at IS NULL DO NOTHING
RETURNING key_id, reason
),
counts AS (
    SELECT count(*) AS deleted, count(*) FILTER (WHERE needs_review) AS unprocessable FROM deleted
)
SELECT
    c.deleted, c.unprocessable,
    (SELECT count(*) FROM flagged WHERE reason = @unfinished::text),
    (SELECT count(*) FROM flagged WHERE reason = @gave_up::text),
    b.created_at, b.id, b.id IS NOT NULL
FROM counts c LEFT JOIN bound b ON true
