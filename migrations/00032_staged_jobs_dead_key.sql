-- staged_jobs_dead keeps every dead letter, two of one staged id included
-- (issue 49). Its primary key was the staged id, so a row dead-lettered
-- under an id an earlier dead letter still holds (a row staged with an
-- explicit id, or staged again under a dead letter's id while that one
-- was kept) made the enqueuer's dead-letter insert fail with 23505 at
-- every batch that took it: the drain stopped behind it. Now each dead
-- letter has its own key, dead_id, and id is the staged id it had, indexed,
-- not unique. `idemctl dead show|requeue <id>` act on the newest dead
-- letter of the id (by dead_at); `dead list` shows them all.
--
-- Additive for the previous release: its enqueuer names the columns it
-- inserts (dead_id fills itself) and its requeue deletes by id, which with
-- two dead letters of one id stages neither (staged_jobs' own key refuses
-- the second) and changes nothing. The table is the short list of rows
-- that could not move: adding the identity column rewrites it under its
-- lock for that moment (--ddl-lock-timeout).
-- +goose Up
ALTER TABLE staged_jobs_dead
    DROP CONSTRAINT IF EXISTS staged_jobs_dead_pkey,
    ADD COLUMN IF NOT EXISTS dead_id BIGINT GENERATED ALWAYS AS IDENTITY,
    ADD CONSTRAINT staged_jobs_dead_pkey PRIMARY KEY (dead_id);
CREATE INDEX IF NOT EXISTS staged_jobs_dead_id ON staged_jobs_dead (id);

-- +goose Down
-- Fails, changing nothing, while two dead letters share a staged id:
-- requeue or delete one of them first.
DROP INDEX IF EXISTS staged_jobs_dead_id;
ALTER TABLE staged_jobs_dead
    DROP CONSTRAINT IF EXISTS staged_jobs_dead_pkey,
    DROP COLUMN IF EXISTS dead_id,
    ADD CONSTRAINT staged_jobs_dead_pkey PRIMARY KEY (id);
