WITH locked AS MATERIALIZED (
    SELECT ctid, id, 
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
false) AS ok
    FROM staged_jobs WHERE id >= @from ORDER BY id LIMIT @batch_size FOR UPDATE SKIP LOCKED
), gate AS MATERIALIZED (
    SELECT (SELECT coalesce(max(version), 0) FROM river_migration WHERE line = 'main') = @river_version AS ok
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
    (SELECT coalesce(array_agg(queue), '{}') FROM notified)
