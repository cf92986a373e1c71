-- HOT updates need free space on the key's own page: an UPDATE whose new
-- version does not fit there is never a HOT update, whatever the indexes.
-- The key workload benchmark (completerbench, hot.go; numbers in
-- docs/completer.md) measured, 4 clients, 4 × 8 s per schema, two runs:
-- HOT share 99.6 % at the default fillfactor (100) and 100.0 % at 90, and
-- serialization failures 0.70-0.84× the article's schema with fillfactor
-- 90 (idemd's schema or the article's indexes), against 0.96-1.18× without.
-- The few non-HOT updates each write every index, and those index pages
-- are what the API's SERIALIZABLE phases conflict on.
--
-- fillfactor applies to pages written from now on; existing pages are not
-- rewritten. ALTER TABLE ... SET (fillfactor) takes a SHARE UPDATE
-- EXCLUSIVE lock, which does not block the API's reads or writes. A
-- fillfactor the operator already chose is left alone.
-- +goose Up
-- +goose StatementBegin
DO $$
BEGIN
    IF NOT EXISTS (
        SELECT 1 FROM pg_class c, unnest(COALESCE(c.reloptions, '{}')) AS o(opt)
        WHERE c.oid = 'idempotency_keys'::regclass AND o.opt LIKE 'fillfactor=%'
    ) THEN
        ALTER TABLE idempotency_keys SET (fillfactor = 90);
    END IF;
END;
$$;
-- +goose StatementEnd

-- +goose Down
-- +goose StatementBegin
DO $$
BEGIN
    IF EXISTS (
        SELECT 1 FROM pg_class c, unnest(COALESCE(c.reloptions, '{}')) AS o(opt)
        WHERE c.oid = 'idempotency_keys'::regclass AND o.opt = 'fillfactor=90'
    ) THEN
        ALTER TABLE idempotency_keys RESET (fillfactor);
    END IF;
END;
$$;
-- +goose StatementEnd
