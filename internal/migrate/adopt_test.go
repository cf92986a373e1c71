package migrate_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemd/idemd/idem"
	"github.com/idemd/idemd/internal/migrate"
	"github.com/idemd/idemd/internal/testing/articletest"
	"github.com/idemd/idemd/internal/testing/dbtest"
	"github.com/idemd/idemd/internal/testing/testwait"
)

// articlePools returns a database with the article's schema, migrated by
// idemd but not adopted, as the runtime role (the API's writes) and as the
// migrator (idemctl migrate).
func articlePools(t *testing.T) (runtime, migrator *pgxpool.Pool) {
	t.Helper()
	u := articletest.NewDatabase(t)
	open := func(u string) *pgxpool.Pool {
		p, err := pgxpool.New(context.Background(), u)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(p.Close)
		return p
	}
	return open(u), open(dbtest.MigratorURL(u))
}

// seedFinished inserts n finished keys whose JSONB bodies are written the
// way an article API writes them (spaces, key order of its own), and
// returns each key's response_body::text, what it is replayed as.
func seedFinished(t *testing.T, pool *pgxpool.Pool, n int) map[string]string {
	t.Helper()
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `
INSERT INTO idempotency_keys (idempotency_key, user_id, locked_at, request_method, request_path, request_params,
                              recovery_point, response_code, response_body)
SELECT 'seed-' || i, $1, NULL, 'POST', '/rides', '{}', 'finished', 201,
       ('{"ride_id":' || i || ',  "message": "Payment accepted.", "amount":20.00}')::jsonb
FROM generate_series(1, $2) i`, articletest.UserID, n); err != nil {
		t.Fatal(err)
	}
	// And some unfinished ones, without a body.
	if _, err := pool.Exec(ctx, `
INSERT INTO idempotency_keys (idempotency_key, user_id, locked_at, request_method, request_path, request_params, recovery_point)
SELECT 'open-' || i, $1, NULL, 'POST', '/rides', '{}', 'started' FROM generate_series(1, 50) i`, articletest.UserID); err != nil {
		t.Fatal(err)
	}
	return bodies(t, pool, "seed-%")
}

func bodies(t *testing.T, pool *pgxpool.Pool, like string) map[string]string {
	t.Helper()
	rows, err := pool.Query(context.Background(), `SELECT idempotency_key, response_body::text FROM idempotency_keys
		WHERE idempotency_key LIKE $1 AND response_body IS NOT NULL`, like)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	var k, b string
	if _, err := pgx.ForEachRow(rows, []any{&k, &b}, func() error { out[k] = b; return nil }); err != nil {
		t.Fatal(err)
	}
	return out
}

func columnState(t *testing.T, pool *pgxpool.Pool) (bodyType string, copyColumn, trigger bool) {
	t.Helper()
	ctx := context.Background()
	bodyType, err := migrate.ResponseBodyType(ctx, pool)
	if err != nil {
		t.Fatal(err)
	}
	if err := pool.QueryRow(ctx, `SELECT
		EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = 'idempotency_keys'::regclass AND attname = $1 AND NOT attisdropped),
		EXISTS (SELECT 1 FROM pg_trigger WHERE tgrelid = 'idempotency_keys'::regclass AND tgname = 'idemd_adopt_response_body')`,
		migrate.AdoptColumn).Scan(&copyColumn, &trigger); err != nil {
		t.Fatal(err)
	}
	return bodyType, copyColumn, trigger
}

type apiLoad struct {
	store    *idem.Store
	mu       sync.Mutex
	answered map[string]string // key -> body of its first response
	errs     []error
	requests atomic.Int64
	slowest  atomic.Int64 // nanoseconds
}

func (a *apiLoad) request(ctx context.Context, key string, body []byte) {
	start := time.Now()
	params := map[string]string{"k": key}
	if strings.HasPrefix(key, "seed-") {
		params = map[string]string{} // seedFinished's
	}
	out, err := a.store.Execute(ctx, idem.Request{UserID: articletest.UserID, Key: key, Method: "POST", Path: "/rides", Params: params},
		idem.Phases{idem.RecoveryPointStarted: func(ctx context.Context, tx pgx.Tx, k *idem.Key) (idem.Result, error) {
			return idem.Response(201, body), nil
		}})
	if d := int64(time.Since(start)); d > a.slowest.Load() {
		a.slowest.Store(d)
	}
	a.requests.Add(1)
	a.mu.Lock()
	defer a.mu.Unlock()
	if err != nil {
		a.errs = append(a.errs, fmt.Errorf("%s: %w", key, err))
		return
	}
	if prev, ok := a.answered[key]; ok {
		if prev != string(out.Body) || !out.Replayed {
			a.errs = append(a.errs, fmt.Errorf("%s: replay %q differs from the first response %q", key, out.Body, prev))
		}
		return
	}
	a.answered[key] = string(out.Body)
}

// The online adoption on a populated table while an API keeps writing
// (new keys finishing, replays of old and new ones) through a Store opened
// on the JSONB column before the run: no request fails, every replay,
// during and after, is what the key first answered, the stored bodies of
// the old rows keep the text they were replayed with, and afterwards
// response_body is TEXT and a new key is replayed byte for byte.
func TestAdoptWhileTheAPIWrites(t *testing.T) {
	runtime, migrator := articlePools(t)
	ctx := context.Background()
	const seeded = 20000
	before := seedFinished(t, runtime, seeded)
	if len(before) != seeded {
		t.Fatalf("seeded %d bodies", len(before))
	}

	store, err := idem.Open(ctx, runtime, idem.Options{})
	if err != nil {
		t.Fatal(err)
	}
	load := &apiLoad{store: store, answered: map[string]string{}}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				key := fmt.Sprintf("live-%d-%d", w, i)
				body := []byte(fmt.Sprintf(`{"ride_id": %d,   "worker":%d}`, i, w))
				if i%5 == 0 {
					body = []byte("plain text answer " + key)
				}
				load.request(ctx, key, body)
				load.request(ctx, key, []byte(`{"unused": true}`)) // a replay
				// And a replay of a seeded key, checked against its
				// text before the adoption.
				seed := fmt.Sprintf("seed-%d", 1+(i*7919+w)%seeded)
				load.mu.Lock()
				load.answered[seed] = before[seed]
				load.mu.Unlock()
				load.request(ctx, seed, []byte(`{"unused": true}`))
			}
		}()
	}
	// The load stops before the test ends, whichever way it ends.
	stopLoad := sync.OnceFunc(func() { close(stop); wg.Wait() })
	t.Cleanup(stopLoad)
	// Let the API run on the JSONB column first.
	testwait.Until(t, 2*time.Minute, "200 API requests on the JSONB column", func() bool { return load.requests.Load() >= 200 })
	res, err := migrate.AdoptArticleSchema(ctx, migrator, migrate.AdoptOptions{BatchSize: 500, Pause: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	// And on the TEXT column with the same store (its statements were
	// prepared against the JSONB column).
	after := load.requests.Load()
	testwait.Until(t, 2*time.Minute, "200 API requests on the TEXT column", func() bool { return load.requests.Load() >= after+200 })
	stopLoad()

	t.Logf("adopt: %+v; %d API requests, slowest %s", *res, load.requests.Load(), time.Duration(load.slowest.Load()))
	if len(load.errs) > 0 {
		t.Fatalf("%d API requests failed or replayed wrong, first: %v", len(load.errs), load.errs[0])
	}
	if res.From != "jsonb" || res.Resumed || res.Backfilled < seeded || res.Batches < seeded/500 {
		t.Fatalf("result %+v", *res)
	}
	typ, copyCol, trig := columnState(t, runtime)
	if typ != "text" || copyCol || trig {
		t.Fatalf("after adoption: response_body %s, copy column %v, trigger %v", typ, copyCol, trig)
	}
	var fn bool
	if err := runtime.QueryRow(ctx, `SELECT to_regproc('idemd_adopt_response_body') IS NOT NULL`).Scan(&fn); err != nil || fn {
		t.Fatalf("trigger function left behind (%v)", err)
	}
	for k, want := range bodies(t, runtime, "seed-%") {
		if want != before[k] {
			t.Fatalf("%s: stored %q after adoption, %q before", k, want, before[k])
		}
	}
	// Every key the API answered is replayed as it first answered, by a
	// store opened on the TEXT column too.
	fresh, err := idem.Open(ctx, runtime, idem.Options{})
	if err != nil {
		t.Fatal(err)
	}
	check := &apiLoad{store: fresh, answered: load.answered}
	for k := range load.answered {
		check.request(ctx, k, []byte(`{"unused": true}`))
	}
	if len(check.errs) > 0 {
		t.Fatalf("%d replays after adoption differ, first: %v", len(check.errs), check.errs[0])
	}
	// New keys are stored byte for byte now.
	check.answered = map[string]string{}
	exact := `{"zeta": 1,   "a": [1.0]}`
	check.request(ctx, "after-adoption", []byte(exact))
	check.request(ctx, "after-adoption", nil)
	if check.answered["after-adoption"] != exact || len(check.errs) > 0 {
		t.Fatalf("after adoption: %q %v", check.answered["after-adoption"], check.errs)
	}
	// And a second run has nothing to do.
	again, err := migrate.AdoptArticleSchema(ctx, migrator, migrate.AdoptOptions{})
	if err != nil || again.From != "text" {
		t.Fatalf("second run: %+v %v", again, err)
	}
}

// A run stopped in the backfill leaves the copy column and its trigger,
// the API still working on the JSONB column; the next run resumes and
// finishes.
func TestAdoptResumesAfterInterruption(t *testing.T) {
	runtime, migrator := articlePools(t)
	before := seedFinished(t, runtime, 3000)
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(300*time.Millisecond, cancel)
	_, err := migrate.AdoptArticleSchema(ctx, migrator, migrate.AdoptOptions{BatchSize: 100, Pause: 50 * time.Millisecond})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("interrupted run: %v", err)
	}
	typ, copyCol, trig := columnState(t, runtime)
	if typ != "jsonb" || !copyCol || !trig {
		t.Fatalf("after the interruption: response_body %s, copy column %v, trigger %v", typ, copyCol, trig)
	}
	// A key finished in between gets its copy from the trigger.
	if _, err := runtime.Exec(context.Background(), `UPDATE idempotency_keys SET recovery_point = 'finished',
		response_code = 200, response_body = '{"b": 2, "a": 1}' WHERE idempotency_key = 'open-1'`); err != nil {
		t.Fatal(err)
	}
	res, err := migrate.AdoptArticleSchema(context.Background(), migrator, migrate.AdoptOptions{BatchSize: 1000})
	if err != nil {
		t.Fatal(err)
	}
	if !res.Resumed || res.Backfilled == 0 || res.Backfilled >= 3000 {
		t.Fatalf("resumed run: %+v (the first run had copied some rows, the trigger open-1)", *res)
	}
	if typ, _, _ := columnState(t, runtime); typ != "text" {
		t.Fatalf("response_body %s", typ)
	}
	got := bodies(t, runtime, "%")
	for k, want := range before {
		if got[k] != want {
			t.Fatalf("%s: %q, want %q", k, got[k], want)
		}
	}
	if got["open-1"] != `{"a": 1, "b": 2}` {
		t.Fatalf("open-1: %q", got["open-1"])
	}
}

// Something else depending on response_body (a view here) stops the run
// before it changes anything, naming it.
func TestAdoptRefusesDependents(t *testing.T) {
	runtime, migrator := articlePools(t)
	ctx := context.Background()
	if _, err := migrator.Exec(ctx, `CREATE VIEW finished_bodies AS SELECT id, response_body FROM idempotency_keys`); err != nil {
		t.Fatal(err)
	}
	_, err := migrate.AdoptArticleSchema(ctx, migrator, migrate.AdoptOptions{})
	if !errors.Is(err, migrate.ErrAdoptBlocked) || !strings.Contains(err.Error(), "finished_bodies") {
		t.Fatalf("got %v", err)
	}
	if typ, copyCol, trig := columnState(t, runtime); typ != "jsonb" || copyCol || trig {
		t.Fatalf("changed anyway: %s %v %v", typ, copyCol, trig)
	}
}

// A transaction holding the table stops the exclusive steps from waiting
// longer than LockTimeout: API statements behind them queue at most that
// long, and the run gives up after LockWait without a change; once the
// transaction ends the run succeeds.
func TestAdoptLockTimeout(t *testing.T) {
	runtime, migrator := articlePools(t)
	ctx := context.Background()
	seedFinished(t, runtime, 10)
	holder, err := runtime.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := holder.Exec(ctx, `SELECT count(*) FROM idempotency_keys`); err != nil {
		t.Fatal(err)
	}
	// An API statement issued while adoption waits for the lock is held at
	// most about LockTimeout.
	done := make(chan time.Duration, 1)
	go func() {
		// Once the adoption's lock request is queued (pg_locks shows it
		// not granted), not after a guess at how long that takes.
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); {
			var waiting bool
			if err := runtime.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_locks
WHERE relation = 'idempotency_keys'::regclass AND NOT granted)`).Scan(&waiting); err != nil || waiting {
				break
			}
		}
		start := time.Now()
		var n int
		_ = runtime.QueryRow(ctx, `SELECT count(*) FROM idempotency_keys`).Scan(&n)
		done <- time.Since(start)
	}()
	start := time.Now()
	res, err := migrate.AdoptArticleSchema(ctx, migrator, migrate.AdoptOptions{LockTimeout: 300 * time.Millisecond, LockWait: time.Second})
	if err == nil || !strings.Contains(err.Error(), "lock was not granted") {
		t.Fatalf("got %+v %v", res, err)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Fatalf("gave up after %s", d)
	}
	if d := <-done; d > 3*time.Second {
		t.Fatalf("an API statement waited %s behind the adoption's lock wait", d)
	}
	if typ, copyCol, _ := columnState(t, runtime); typ != "jsonb" || copyCol {
		t.Fatalf("changed anyway: %s %v", typ, copyCol)
	}
	if err := holder.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if res, err := migrate.AdoptArticleSchema(ctx, migrator, migrate.AdoptOptions{LockTimeout: 300 * time.Millisecond}); err != nil || res.From != "jsonb" {
		t.Fatalf("after the holder ended: %+v %v", res, err)
	}
}

// On idemd's own schema there is nothing to adopt.
func TestAdoptNativeIsANoOp(t *testing.T) {
	pool := dbtest.MigratorPool(t, dbtest.NewPool(t))
	res, err := migrate.AdoptArticleSchema(context.Background(), pool, migrate.AdoptOptions{})
	if err != nil || res.From != "text" || res.Batches != 0 {
		t.Fatalf("%+v %v", res, err)
	}
}
