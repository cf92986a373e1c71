SELECT c.id, u.created_at AS tracked_at
    FROM idemd_unfinished_keys u
    JOIN idempotency_keys c ON c.id = u.key_id
    WHERE u.created_at < now() - @grace::interval
      AND recovery_point <> 'finished' AND completer_gave_up_at IS NULL
      AND c.created_at < now() - @grace::interval
      AND (c.last_run_at < now() - @idle::interval OR c.last_run_at <= c.completer_replayed_at)
      AND (c.locked_at IS NULL OR c.locked_at < now() - @lock_timeout::interval)
      AND (c.completer_next_attempt_at IS NULL OR c.completer_next_attempt_at <= now())
      AND (c.completer_leased_until IS NULL OR c.completer_leased_until < now())
    ORDER BY u.created_at, u.key_id
    LIMIT @batch_size
