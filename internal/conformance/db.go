package conformance

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemd/idemd/internal/riverdb"
)

// db is the oracle: idemd's tables, read independently of the API.
type db struct {
	pool  *pgxpool.Pool
	dead  bool // staged_jobs_dead can be read
	river bool // river_job exists and can be read

	mu   sync.Mutex
	made []int64 // the keys the run inserted
}

// openDB checks the tables the database scenarios read.
func (r *run) openDB(ctx context.Context) error {
	d := &db{pool: r.cfg.Pool}
	var keys, staged, dead, river bool
	err := d.pool.QueryRow(ctx, `SELECT to_regclass('idempotency_keys') IS NOT NULL, to_regclass('staged_jobs') IS NOT NULL,
		to_regclass('staged_jobs_dead') IS NOT NULL, to_regclass($1) IS NOT NULL`, riverdb.JobTable).Scan(&keys, &staged, &dead, &river)
	if err != nil {
		return fmt.Errorf("conformance: read the database's tables: %w", err)
	}
	if !keys {
		return errors.New("conformance: the database has no idempotency_keys: give the API's database")
	}
	if missing, err := d.missingColumns(ctx); err != nil {
		return err
	} else if missing != "" || !staged {
		// The article's schema without idemd's: the scenarios that read
		// or write the tables would fail on a column they need, so they
		// say what to run instead, and the others run.
		what := "no staged_jobs"
		if missing != "" {
			what = "idempotency_keys has no " + missing
		}
		r.noSchema = "idemd's schema, which this database lacks (" + what + "): run `idemctl migrate` against it (docs/adopt.md)"
		return nil
	}
	// Where the enqueuer moves jobs: the API's role may not read them (the
	// daemons' role does); unread, a job moved during the run is missed.
	d.dead = dead && d.readable(ctx, "staged_jobs_dead")
	d.river = river && d.readable(ctx, riverdb.JobTable)
	r.db = d
	return nil
}

// oracleColumns are the idempotency_keys columns the scenarios read and
// write (keyColumns, clone): the article's, and idemd's request_fingerprint
// and upstream_idempotency_key.
var oracleColumns = []string{"id", "idempotency_key", "user_id", "recovery_point", "locked_at", "response_code",
	"response_body", "request_method", "request_path", "request_params", "last_run_at", "request_fingerprint",
	"upstream_idempotency_key"}

// missingColumns names the oracleColumns idempotency_keys lacks, "" when
// none.
func (d *db) missingColumns(ctx context.Context) (string, error) {
	rows, err := d.pool.Query(ctx, `SELECT attname::text FROM pg_attribute
WHERE attrelid = to_regclass('idempotency_keys') AND attnum > 0 AND NOT attisdropped`)
	if err != nil {
		return "", fmt.Errorf("conformance: read idempotency_keys' columns: %w", err)
	}
	have, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return "", fmt.Errorf("conformance: read idempotency_keys' columns: %w", err)
	}
	var missing []string
	for _, c := range oracleColumns {
		if !slices.Contains(have, c) {
			missing = append(missing, c)
		}
	}
	return strings.Join(missing, ", "), nil
}

func (d *db) readable(ctx context.Context, table string) bool {
	_, err := d.pool.Exec(ctx, `SELECT 1 FROM `+pgx.Identifier{table}.Sanitize()+` LIMIT 0`)
	return err == nil
}

// keyRow is one idempotency_keys row as the API left it.
type keyRow struct {
	id            int64
	key           string
	userID        int64
	recoveryPoint string
	locked        bool
	code          *int
	body          *string
	method, path  string
	params        string // request_params as stored (JSON text)
	xmin          string // changes whenever the row is written
}

const keyColumns = `id, idempotency_key, user_id, recovery_point, locked_at IS NOT NULL, response_code, response_body::text,
	request_method, request_path, request_params::text, xmin::text`

func scanKey(row pgx.Row) (keyRow, error) {
	var k keyRow
	err := row.Scan(&k.id, &k.key, &k.userID, &k.recoveryPoint, &k.locked, &k.code, &k.body, &k.method, &k.path, &k.params, &k.xmin)
	return k, err
}

// keys returns every row with the key value, of any user.
func (d *db) keys(ctx context.Context, key string) ([]keyRow, error) {
	rows, err := d.pool.Query(ctx, `SELECT `+keyColumns+` FROM idempotency_keys WHERE idempotency_key = $1 ORDER BY id`, key)
	if err != nil {
		return nil, fmt.Errorf("read idempotency_keys: %w", err)
	}
	defer rows.Close()
	var out []keyRow
	for rows.Next() {
		k, err := scanKey(rows)
		if err != nil {
			return nil, fmt.Errorf("read idempotency_keys: %w", err)
		}
		out = append(out, k)
	}
	return out, rows.Err()
}

// one returns the one row with the key, or a failure naming how many.
func (d *db) one(ctx context.Context, key string) (keyRow, error) {
	rows, err := d.keys(ctx, key)
	if err != nil {
		return keyRow{}, err
	}
	if len(rows) != 1 {
		return keyRow{}, failf("idempotency_keys has %d rows with the key %s, want 1", len(rows), key)
	}
	return rows[0], nil
}

// byID re-reads a row.
func (d *db) byID(ctx context.Context, id int64) (keyRow, error) {
	k, err := scanKey(d.pool.QueryRow(ctx, `SELECT `+keyColumns+` FROM idempotency_keys WHERE id = $1`, id))
	if err != nil {
		return keyRow{}, fmt.Errorf("read idempotency_keys row %d: %w", id, err)
	}
	return k, nil
}

// lockState is how a key the run makes is locked.
type lockState string

const (
	unlocked    lockState = "unlocked" // the request failed or its client went away; the key was unlocked
	lockedNow   lockState = "now"      // a request holds it right now
	lockedStale lockState = "stale"    // its request crashed an hour ago, holding the lock
)

// staleLockAge is how long ago a crashed request locked a key: far past
// any lock timeout an API should have (the completer's default is 90 s).
const staleLockAge = "1 hour"

// clone inserts a key the API did not write: from's request under a new
// key value, at recovery point started, as a client leaves it when it
// goes away after the key was claimed, locked as lock says. Every clone
// is deleted at the end of the run unless the API finished it.
func (d *db) clone(ctx context.Context, from keyRow, key string, lock lockState) (keyRow, error) {
	k, err := scanKey(d.pool.QueryRow(ctx, `INSERT INTO idempotency_keys
		(idempotency_key, user_id, locked_at, last_run_at, request_method, request_path, request_params,
		 request_fingerprint, recovery_point, upstream_idempotency_key)
		SELECT $1, user_id, CASE $3::text WHEN 'now' THEN now() WHEN 'stale' THEN now() - $4::interval END,
		 CASE $3::text WHEN 'stale' THEN now() - $4::interval ELSE now() END, request_method, request_path, request_params,
		 request_fingerprint, 'started', gen_random_uuid()
		FROM idempotency_keys WHERE id = $2
		RETURNING `+keyColumns, key, from.id, string(lock), staleLockAge))
	if err != nil {
		return keyRow{}, fmt.Errorf("insert an abandoned key: %w", err)
	}
	d.mu.Lock()
	d.made = append(d.made, k.id)
	d.mu.Unlock()
	return k, nil
}

// unchanged fails unless the row is as before was read.
func (d *db) unchanged(ctx context.Context, before keyRow, what string) error {
	after, err := d.byID(ctx, before.id)
	if err != nil {
		return err
	}
	if after.xmin != before.xmin {
		return failf("%s, yet it wrote the key (recovery point %s -> %s, locked %v -> %v)",
			what, before.recoveryPoint, after.recoveryPoint, before.locked, after.locked)
	}
	return nil
}

// cleanup removes the keys the run inserted that the API did not finish:
// left, a completer would replay them. The API's role may not delete
// keys (idemd_api may not); such keys are finished instead, with a 410
// that says who made them, which no completer replays and the reaper
// deletes after its retention.
func (r *run) cleanup() {
	d := r.db
	if d == nil {
		return
	}
	d.mu.Lock()
	ids := d.made
	d.mu.Unlock()
	if len(ids) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := d.pool.Exec(ctx, `DELETE FROM idempotency_keys WHERE id = ANY($1) AND recovery_point <> 'finished'`, ids); err == nil {
		return
	}
	// Best effort: what cannot be finished either is the completer's.
	_, _ = d.pool.Exec(ctx, `UPDATE idempotency_keys SET recovery_point = 'finished', locked_at = NULL, response_code = 410,
		response_body = '{"error":"made by idemctl conformance, never run"}'
		WHERE id = ANY($1) AND recovery_point <> 'finished'`, ids)
}

// jobMark is the highest staged-job id anywhere: in staged_jobs, dead, or
// moved into River (whose rows carry idemd_staged_id).
func (d *db) jobMark(ctx context.Context) (int64, error) {
	q := `SELECT greatest((SELECT max(id) FROM staged_jobs)`
	if d.dead {
		q += `, (SELECT max(id) FROM staged_jobs_dead)`
	}
	if d.river {
		q += `, (` + riverdb.MaxStagedIDSQL + `)`
	}
	var m *int64
	if err := d.pool.QueryRow(ctx, q+`)`).Scan(&m); err != nil {
		return 0, fmt.Errorf("read staged job ids: %w", err)
	}
	if m == nil {
		return 0, nil
	}
	return *m, nil
}

// jobsSince are the staged-job ids above mark, wherever the enqueuer has
// moved them: one statement, one snapshot, so a job being moved is seen
// once.
func (d *db) jobsSince(ctx context.Context, mark int64) ([]int64, error) {
	q := `SELECT id FROM staged_jobs WHERE id > $1`
	if d.dead {
		q += ` UNION SELECT id FROM staged_jobs_dead WHERE id > $1`
	}
	if d.river {
		q += ` UNION ` + riverdb.StagedIDsAboveSQL
	}
	rows, err := d.pool.Query(ctx, q, mark)
	if err != nil {
		return nil, fmt.Errorf("read staged jobs: %w", err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return nil, fmt.Errorf("read staged jobs: %w", err)
	}
	return ids, nil
}

// riverTwice are the staged ids that became more than one River job.
func (d *db) riverTwice(ctx context.Context, ids []int64) ([]int64, error) {
	if !d.river || len(ids) == 0 {
		return nil, nil
	}
	rows, err := d.pool.Query(ctx, riverdb.StagedIDsTwiceSQL, ids)
	if err != nil {
		return nil, fmt.Errorf("read river_job: %w", err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return nil, fmt.Errorf("read river_job: %w", err)
	}
	return out, nil
}
