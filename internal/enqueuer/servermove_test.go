package enqueuer

import (
	"context"
	"encoding/json"
	"errors"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"

	"github.com/idemd/idemd/internal/riverdb"
	"github.com/idemd/idemd/internal/testing/dbtest"
)

// roundTrips records what a pool sends, one entry per round trip: a
// statement sent alone, or a pipeline (a pgx batch) of several.
type roundTrips struct {
	mu   sync.Mutex
	sent []string
}

func (r *roundTrips) add(s string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.sent = append(r.sent, s)
}

func (r *roundTrips) take() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := r.sent
	r.sent = nil
	return s
}

func (r *roundTrips) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	r.add(strings.Join(strings.Fields(d.SQL), " "))
	return ctx
}
func (r *roundTrips) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
func (r *roundTrips) TraceBatchStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceBatchStartData) context.Context {
	var qs []string
	for _, q := range d.Batch.QueuedQueries {
		qs = append(qs, strings.Join(strings.Fields(q.SQL), " "))
	}
	r.add("pipeline: " + strings.Join(qs, " | "))
	return ctx
}
func (r *roundTrips) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}
func (r *roundTrips) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData)     {}
func (r *roundTrips) TraceCopyFromStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceCopyFromStartData) context.Context {
	r.add("copy " + d.TableName.Sanitize())
	return ctx
}
func (r *roundTrips) TraceCopyFromEnd(context.Context, *pgx.Conn, pgx.TraceCopyFromEndData) {}

// idleInTransaction counts the sessions on the test's database left in a
// transaction.
func idleInTransaction(t *testing.T, pool *pgxpool.Pool) int64 {
	t.Helper()
	return count(t, pool, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND state LIKE 'idle in transaction%'`)
}

// A move is one round trip: BEGIN, its settings, the move and COMMIT in one
// pipeline; so is a move that finds nothing. Its rows reach River once (the
// SQL oracle), and the pool keeps no connection in a transaction after it.
func TestMoveIsOneRoundTrip(t *testing.T) {
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(dbtest.NewDatabase(t))
	if err != nil {
		t.Fatal(err)
	}
	trips := &roundTrips{}
	cfg.ConnConfig.Tracer = trips
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	s := newService(t, pool)

	if _, err := pool.Exec(ctx, `INSERT INTO staged_jobs (job_name, job_args) SELECT 'send_ride_receipt', jsonb_build_object('n', g) FROM generate_series(1, 3) g`); err != nil {
		t.Fatal(err)
	}
	for _, want := range []int{3, 0} {
		trips.take()
		res, err := s.serverBatch(ctx, fullPass, fullPass, riverNewest)
		if err != nil {
			t.Fatal(err)
		}
		if res == nil || res.moved != want || res.taken != want {
			t.Fatalf("move: %+v, want %d rows moved", res, want)
		}
		sent := trips.take()
		if len(sent) != 1 || !strings.HasPrefix(sent[0], "pipeline: BEGIN | ") || !strings.Contains(sent[0], "INSERT INTO river_job") || !strings.HasSuffix(sent[0], " | COMMIT") {
			t.Fatalf("a move of %d rows sent %d round trips, want one pipeline from BEGIN to COMMIT:\n%s", want, len(sent), strings.Join(sent, "\n"))
		}
	}
	if ids := stagedIDsInRiver(t, pool); len(ids) != 3 {
		t.Fatalf("River holds staged ids %v, want 3", ids)
	}
	if n := idleInTransaction(t, pool); n != 0 {
		t.Fatalf("%d sessions left in a transaction", n)
	}
}

// A move that River's table refuses (here a CHECK constraint an operator
// added) is errRiverRejected, changes nothing, and leaves no connection in
// the pool in its failed transaction.
func TestRefusedServerMoveLeavesNothingOpen(t *testing.T) {
	ctx := context.Background()
	pool := dbtest.NewPool(t)
	if _, err := dbtest.MigratorPool(t, pool).Exec(ctx, `ALTER TABLE river_job ADD CONSTRAINT no_poison CHECK (NOT args ? 'poison')`); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO staged_jobs (job_name, job_args) VALUES ('k', '{"n": 1}'), ('k', '{"poison": true}')`); err != nil {
		t.Fatal(err)
	}
	s := newService(t, pool)
	if _, err := s.moveInServer(ctx, fullPass, fullPass, riverNewest); !errors.Is(err, errRiverRejected) {
		t.Fatalf("move of a refused row: %v, want errRiverRejected", err)
	}
	if n := count(t, pool, `SELECT count(*) FROM staged_jobs`); n != 2 {
		t.Fatalf("%d rows staged after the refused move, want both", n)
	}
	if n := count(t, pool, `SELECT count(*) FROM river_job`); n != 0 {
		t.Fatalf("%d River jobs after the refused move", n)
	}
	// A connection handed out in the failed transaction would fail
	// every statement (25P02).
	for range 2 * int(pool.Config().MaxConns) {
		if _, err := pool.Exec(ctx, "SELECT 1"); err != nil {
			t.Fatalf("the pool handed out a connection in the failed transaction: %v", err)
		}
	}
	if n := idleInTransaction(t, pool); n != 0 {
		t.Fatalf("%d sessions left in a transaction", n)
	}
}

// The server-side move writes the River job River's client writes for the
// same staged row: each row below is staged twice, once moved by the Go
// path (River's InsertManyTx) and once by riverdb.MoveSQL, and the two jobs must be
// equal column for column but for the id and the staged id; an unset
// scheduled_at is the insert's time in both.
func TestServerMoveInsertsWhatRiverInserts(t *testing.T) {
	pool := dbtest.NewPool(t)
	assertGoAndServerMovesAgree(t, newService(t, pool), pool)
}

// assertGoAndServerMovesAgree stages the same rows twice and moves them
// once by the Go path (River's InsertManyTx) and once by riverdb.MoveSQL, on the
// River schema the database has, and compares the jobs column for column
// but for the id, the staged id and the unique key (each pass stages its
// own, or the second pass's would be duplicates of the first's).
func assertGoAndServerMovesAgree(t *testing.T, s *Service, pool *pgxpool.Pool) {
	t.Helper()
	ctx := context.Background()
	version, err := s.riverVersion(ctx)
	if err != nil {
		t.Fatal(err)
	}
	const stage = `
INSERT INTO staged_jobs (created_at, job_name, job_args, queue, priority, max_attempts, scheduled_at, tags, metadata, unique_key, unique_states)
SELECT created_at, job_name, jsonb_set(job_args, '{case}', to_jsonb(n)), queue, priority, max_attempts, scheduled_at, tags, metadata,
    CASE WHEN unique_states IS NOT NULL THEN sha256(convert_to($1::text || ':' || n, 'UTF8')) END, unique_states
FROM (VALUES
    (1, '2026-12-04 18:52:27+00'::timestamptz, 'send_ride_receipt', '{"ride_id": 9007199254740993}'::jsonb, NULL, NULL::int, NULL::int, NULL::timestamptz, NULL::text[], NULL::jsonb, NULL::bit(8)),
    (2, '2026-12-04 18:52:27.1+00', 'k', '{"s": "é\u00e9 \"q\""}', 'mail', 3, 7, NULL, '{a_b,x-1y}', '{}', NULL),
    (3, '2026-12-04 18:52:27.000001+00', 'k', '{}', 'a|b-c_d', 4, 1, '2030-01-01 00:00:00+00', '{}', '{"snowflake": 9007199254740993, "nested": {"a": [1, 2.50]}}', NULL),
    (4, '2026-12-04 18:52:27.123456+00', 'k', '{"n": 1}', NULL, 1, 32767, '2020-01-01 00:00:00+00', NULL, '{"idemd_staged_id": "overwritten"}', NULL),
    (5, '1999-01-31 23:59:59.99+00', 'k', '{"n": 2}', 'default', NULL, NULL, NULL, '{abc}', NULL, NULL),
    (6, '2026-06-30 12:00:00.5+02', 'k', '{"n": 3}', 'q1', 2, NULL, '2026-12-04 18:00:00+00', NULL, '{"k": null}', NULL),
    (7, '2026-12-04 18:52:27+00', 'k', '{"n": 4}', NULL, NULL, NULL, NULL, NULL, NULL, B'11110101'),
    (8, '2026-12-04 18:52:27+00', 'k', '{"n": 5}', NULL, NULL, NULL, '0001-01-01 00:00:00+00', NULL, NULL, NULL),
    (9, '0001-01-01 00:00:00+00', 'k', '{"n": 6}', NULL, NULL, NULL, '9999-12-31 23:59:59.999999+00', NULL, NULL, B'11010001')
) v(n, created_at, job_name, job_args, queue, priority, max_attempts, scheduled_at, tags, metadata, unique_states)`
	const cases = 9
	if _, err := pool.Exec(ctx, stage, "go"); err != nil {
		t.Fatal(err)
	}
	goRes, err := s.moveBatch(ctx, fullPass, fullPass, false, version)
	if err != nil || goRes.moved != cases {
		t.Fatalf("Go path: %+v, %v", goRes, err)
	}
	if _, err := pool.Exec(ctx, stage, "sql"); err != nil {
		t.Fatal(err)
	}
	res, err := s.serverBatch(ctx, fullPass, fullPass, version)
	if err != nil || res == nil || res.moved != cases {
		t.Fatalf("server move: %+v, %v", res, err)
	}
	rows, err := pool.Query(ctx, `
SELECT j.args->>'case', (j.metadata->>'idemd_staged_id')::bigint,
       (to_jsonb(j) - 'id' - 'created_at' - 'scheduled_at' - 'metadata' - 'unique_key' || jsonb_build_object(
           'metadata', j.metadata - 'idemd_staged_id',
           'unique_key', j.unique_key IS NOT NULL,
           'scheduled_at', CASE WHEN j.scheduled_at = j.created_at THEN 'at insert' ELSE j.scheduled_at::text END))::text
FROM river_job j ORDER BY (j.args->>'case')::int, j.id`)
	if err != nil {
		t.Fatal(err)
	}
	type job struct {
		Case     string
		StagedID int64
		Rest     string
	}
	jobs, err := pgx.CollectRows(rows, pgx.RowToStructByPos[job])
	if err != nil {
		t.Fatal(err)
	}
	if len(jobs) != 2*cases {
		t.Fatalf("%d River jobs, want %d", len(jobs), 2*cases)
	}
	// By case, the Go path's job first (it moved first).
	for i := range cases {
		byGo, bySQL := jobs[2*i], jobs[2*i+1]
		if byGo.Case != bySQL.Case || byGo.StagedID == bySQL.StagedID {
			t.Fatalf("jobs %d and %d: cases %s, %s, staged ids %d, %d", 2*i, 2*i+1, byGo.Case, bySQL.Case, byGo.StagedID, bySQL.StagedID)
		}
		if byGo.Rest != bySQL.Rest {
			t.Errorf("case %s:\nRiver's client: %s\nserver move:    %s", byGo.Case, byGo.Rest, bySQL.Rest)
		}
	}
	// The oracle for the staged ids: every staged row's id, once.
	if ids := stagedIDsInRiver(t, pool); len(slices.Compact(ids)) != 2*cases {
		t.Fatalf("staged ids in River %v, want %d distinct", ids, 2*cases)
	}
}

// riverdb.ValidSQL decides as riverdb.Validator.Check does, for rows made to sit on each
// rule's edges and for random queue names and tags, with and without an
// allow-list of kinds.
func TestServerMoveValidatesAsGoDoes(t *testing.T) {
	ctx := context.Background()
	pool := dbtest.NewPool(t)
	if _, err := pool.Exec(ctx, `
INSERT INTO staged_jobs (job_name, job_args, queue, priority, max_attempts, tags, metadata)
VALUES ('ok', '{}', NULL, NULL, NULL, NULL, NULL),
       ('', '{}', NULL, NULL, NULL, NULL, NULL),
       (repeat('k', 127), '{}', NULL, NULL, NULL, NULL, NULL),
       (repeat('k', 128), '{}', NULL, NULL, NULL, NULL, NULL),
       (repeat('é', 63), '{}', NULL, NULL, NULL, NULL, NULL),
       (repeat('é', 64), '{}', NULL, NULL, NULL, NULL, NULL),
       ('other', '{}', NULL, NULL, NULL, NULL, NULL),
       ('ok', '[]', NULL, NULL, NULL, NULL, NULL),
       ('ok', '"s"', NULL, NULL, NULL, NULL, NULL),
       ('ok', 'null', NULL, NULL, NULL, NULL, NULL),
       ('ok', jsonb_build_object('s', repeat('x', 18)), NULL, NULL, NULL, NULL, NULL),
       ('ok', jsonb_build_object('s', repeat('x', 19)), NULL, NULL, NULL, NULL, NULL),
       ('ok', '{}', '', NULL, NULL, NULL, NULL),
       ('ok', '{}', repeat('q', 64), NULL, NULL, NULL, NULL),
       ('ok', '{}', repeat('q', 65), NULL, NULL, NULL, NULL),
       ('ok', '{}', NULL, 0, NULL, NULL, NULL),
       ('ok', '{}', NULL, 1, NULL, NULL, NULL),
       ('ok', '{}', NULL, 4, NULL, NULL, NULL),
       ('ok', '{}', NULL, 5, NULL, NULL, NULL),
       ('ok', '{}', NULL, NULL, 0, NULL, NULL),
       ('ok', '{}', NULL, NULL, 32767, NULL, NULL),
       ('ok', '{}', NULL, NULL, 32768, NULL, NULL),
       ('ok', '{}', NULL, NULL, -1, NULL, NULL),
       ('ok', '{}', NULL, NULL, NULL, '{}', NULL),
       ('ok', '{}', NULL, NULL, NULL, ARRAY[repeat('t', 255)], NULL),
       ('ok', '{}', NULL, NULL, NULL, ARRAY[repeat('t', 256)], NULL),
       ('ok', '{}', NULL, NULL, NULL, '{ab}', NULL),
       ('ok', '{}', NULL, NULL, NULL, '{abc,"a b c"}', NULL),
       ('ok', '{}', NULL, NULL, NULL, '{abc,NULL}', NULL),
       ('ok', '{}', NULL, NULL, NULL, NULL, '{}'),
       ('ok', '{}', NULL, NULL, NULL, NULL, '[]'),
       ('ok', '{}', NULL, NULL, NULL, NULL, 'null'),
       ('ok', '{}', NULL, NULL, NULL, NULL, '1')`); err != nil {
		t.Fatal(err)
	}
	// The times, tags' shapes and unique columns on their edges.
	if _, err := pool.Exec(ctx, `
INSERT INTO staged_jobs (job_name, job_args, scheduled_at, created_at, tags, unique_key, unique_states)
VALUES ('ok', '{}', 'infinity', now(), NULL, NULL, NULL),
       ('ok', '{}', '-infinity', now(), NULL, NULL, NULL),
       ('ok', '{}', '0001-01-01 00:00:00+00', now(), NULL, NULL, NULL),
       ('ok', '{}', '0001-01-01 00:00:00+00'::timestamptz - interval '1 microsecond', now(), NULL, NULL, NULL),
       ('ok', '{}', '9999-12-31 23:59:59.999999+00', now(), NULL, NULL, NULL),
       ('ok', '{}', '10000-01-01 00:00:00+00', now(), NULL, NULL, NULL),
       ('ok', '{}', '4713-01-01 00:00:00+00 BC', now(), NULL, NULL, NULL),
       ('ok', '{}', NULL, 'infinity', NULL, NULL, NULL),
       ('ok', '{}', NULL, '-infinity', NULL, NULL, NULL),
       ('ok', '{}', NULL, '12000-01-01 00:00:00+00', NULL, NULL, NULL),
       ('ok', '{}', NULL, now(), '{{abc,def},{ghi,jkl}}', NULL, NULL),
       ('ok', '{}', NULL, now(), '[2:3]={abc,def}', NULL, NULL),
       ('ok', '{}', NULL, now(), NULL, sha256('k'), B'11110101'),
       ('ok', '{}', NULL, now(), NULL, sha256('k'), B'11010001'),
       ('ok', '{}', NULL, now(), NULL, sha256('k'), B'01010001'),
       ('ok', '{}', NULL, now(), NULL, sha256('k'), B'00000000'),
       ('ok', '{}', NULL, now(), NULL, sha256('k'), NULL),
       ('ok', '{}', NULL, now(), NULL, NULL, B'11110101'),
       ('ok', '{}', NULL, now(), NULL, '\x00', B'11110101'),
       ('ok', '{}', NULL, now(), NULL, '', B'11110101')`); err != nil {
		t.Fatal(err)
	}
	// Random queue names and tags: mostly what both patterns accept,
	// with their separators and, now and then, what neither does.
	rng := rand.New(rand.NewPCG(1, 2))
	word := func() string {
		b := make([]rune, rng.IntN(8))
		for i := range b {
			from := []rune("abz09")
			switch p := rng.IntN(20); {
			case p >= 17:
				from = []rune("_-|")
			case p == 16:
				from = []rune("AZ. é\n")
			}
			b[i] = from[rng.IntN(len(from))]
		}
		return string(b)
	}
	batch := &pgx.Batch{}
	for range 3000 {
		batch.Queue(`INSERT INTO staged_jobs (job_name, job_args, queue, tags) VALUES ('ok', '{}', $1, $2)`, word(), []string{word()})
	}
	if err := pool.SendBatch(ctx, batch).Close(); err != nil {
		t.Fatal(err)
	}
	for _, allowed := range [][]string{nil, {"ok", strings.Repeat("k", 127)}} {
		s := newService(t, pool, func(c *Settings) { c.AllowedKinds = allowed; c.MaxArgsBytes = 27 })
		args := s.moveArgs(fullPass, fullPass, riverNewest)
		rows, err := pool.Query(ctx, `SELECT id, created_at, job_name, job_args, queue, priority, max_attempts, scheduled_at, tags, metadata, unique_key, unique_states, `+riverdb.ValidSQL+` FROM staged_jobs ORDER BY id`, args)
		if err != nil {
			t.Fatal(err)
		}
		var valid, invalid int
		for rows.Next() {
			var r riverdb.StagedRow
			var ok bool
			if err := rows.Scan(&r.ID, &r.CreatedAt, &r.Kind, &r.Args, &r.Queue, &r.Priority, &r.MaxAttempts, &r.ScheduledAt, &r.Tags, &r.Metadata, &r.UniqueKey, &r.UniqueStates, &ok); err != nil {
				t.Fatal(err)
			}
			bad := s.valid.Check(&r)
			if ok != (bad == nil) {
				t.Errorf("allowed %v: row %d (kind %q, args %s, queue %v, tags %v, metadata %s): SQL says valid %v, Go says %v", allowed, r.ID, r.Kind, r.Args, r.Queue, r.Tags, r.Metadata, ok, bad)
			}
			if ok {
				valid++
			} else {
				invalid++
			}
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		// Both answers must be common among the random rows, or the
		// comparison proves little.
		if valid < 100 || invalid < 100 {
			t.Fatalf("allowed %v: %d valid and %d invalid rows, want at least 100 of each", allowed, valid, invalid)
		}
	}
}

// The server-side move sends River's insert notification the way River's
// client does: received by River's own listener (its driver's, so the
// channel's name is River's), once per queue of available jobs, and not
// again for a queue within River's fetch cooldown.
func TestServerMoveNotifiesRiver(t *testing.T) {
	ctx := context.Background()
	pool := dbtest.NewPool(t)
	l := riverpgxv5.New(pool).GetListener(&riverdriver.GetListenenerParams{})
	if err := l.Connect(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close(context.Background()) }) //nolint:errcheck
	if err := l.Listen(ctx, "river_insert"); err != nil {
		t.Fatal(err)
	}
	s := newService(t, pool)
	if _, err := pool.Exec(ctx, `INSERT INTO staged_jobs (job_name, job_args, queue, scheduled_at)
VALUES ('k', '{}', NULL, NULL), ('k', '{}', 'mail', NULL), ('k', '{}', 'mail', NULL), ('k', '{}', 'later', '2030-01-01 00:00:00+00')`); err != nil {
		t.Fatal(err)
	}
	r, err := s.moveInServer(ctx, fullPass, fullPass, riverNewest)
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(r.notified)
	if r.moved != 4 || !slices.Equal(r.notified, []string{"default", "mail"}) {
		t.Fatalf("move: %+v, want 4 moved and default and mail notified", r)
	}
	got := map[string]bool{}
	for len(got) < 2 {
		waitCtx, cancel := context.WithTimeout(ctx, time.Minute)
		n, err := l.WaitForNotification(waitCtx)
		cancel()
		if err != nil {
			t.Fatalf("waiting for River's insert notifications (have %v): %v", got, err)
		}
		var p struct{ Queue string }
		if err := json.Unmarshal([]byte(n.Payload), &p); err != nil || got[p.Queue] {
			t.Fatalf("notification %+v: %v, or a queue twice (have %v)", n, err, got)
		}
		got[p.Queue] = true
	}
	if !got["default"] || !got["mail"] {
		t.Fatalf("River heard of queues %v, want default and mail", got)
	}
	// Within the cooldown a queue is quiet; after it, heard again.
	now := time.Now()
	var n insertNotices
	n.sent([]string{"mail"}, now)
	if q := n.quiet(now.Add(river.FetchCooldownDefault - time.Millisecond)); !slices.Equal(q, []string{"mail"}) {
		t.Fatalf("quiet within the cooldown: %v", q)
	}
	if q := n.quiet(now.Add(river.FetchCooldownDefault)); len(q) != 0 {
		t.Fatalf("quiet after the cooldown: %v", q)
	}
}
