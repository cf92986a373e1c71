WITH RECURSIVE bounds (i, created_at) AS (
    SELECT 0, (
        SELECT k.created_at
        FROM idempotency_keys k
        WHERE k.created_at < COALESCE(@now::timestamptz, now()) - @retention::interval
          AND k.created_at >= COALESCE(@cursor_at::timestamptz, '-infinity')
        ORDER BY k.created_at
        LIMIT 1)
    UNION ALL
    SELECT b.i + 1, (
        SELECT k.created_at
        FROM idempotency_keys k
        WHERE k.created_at < COALESCE(@now::timestamptz, now()) - @retention::interval
          AND k.created_at >= b.created_at
        ORDER BY k.created_at
        OFFSET @batch_size::int
        LIMIT 1)
    FROM bounds b
    WHERE b.i < @width::int - 1 AND b.created_at IS NOT NULL
)
SELECT created_at FROM bounds WHERE created_at IS NOT NULL ORDER BY i
