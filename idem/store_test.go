package idem_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemd/idemd/idem"
	"github.com/idemd/idemd/internal/testing/dbtest"
)

type params struct {
	Amount int     `json:"amount"`
	Lat    float64 `json:"lat"`
}

func newStore(t *testing.T, opts idem.Options) (*idem.Store, *pgxpool.Pool) {
	t.Helper()
	pool := dbtest.NewPool(t)
	return idem.New(pool, opts), pool
}

func req(key string) idem.Request {
	return idem.Request{UserID: 7, Key: key, Method: "POST", Path: "/things", Params: params{Amount: 100, Lat: 1.5}}
}

type keyRow struct {
	RecoveryPoint string
	Locked        bool
	Code          *int
	Body          *string
	Upstream      *string
	Fingerprint   *string
}

func readKey(t *testing.T, pool *pgxpool.Pool, id int64) keyRow {
	t.Helper()
	var r keyRow
	err := pool.QueryRow(context.Background(), `SELECT recovery_point, locked_at IS NOT NULL, response_code,
		response_body, upstream_idempotency_key::text, request_fingerprint FROM idempotency_keys WHERE id = $1`, id).
		Scan(&r.RecoveryPoint, &r.Locked, &r.Code, &r.Body, &r.Upstream, &r.Fingerprint)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func TestBeginInsertsLockedKeyWithUpstreamKey(t *testing.T) {
	t.Parallel()
	s, pool := newStore(t, idem.Options{})
	ctx := context.Background()
	k, err := s.Begin(ctx, req("key-1"))
	if err != nil {
		t.Fatal(err)
	}
	r := readKey(t, pool, k.ID)
	if r.RecoveryPoint != "started" || !r.Locked || r.Upstream == nil || r.Fingerprint == nil {
		t.Fatalf("row %+v", r)
	}
	if *r.Upstream != k.UpstreamIdempotencyKey.String() {
		t.Fatal("upstream key differs from the row")
	}
	// A second request while the first holds the lock: in progress.
	if _, err := s.Begin(ctx, req("key-1")); !errors.Is(err, idem.ErrInProgress) {
		t.Fatalf("want ErrInProgress, got %v", err)
	}
	// Same key, other user: independent.
	other := req("key-1")
	other.UserID = 8
	if _, err := s.Begin(ctx, other); err != nil {
		t.Fatal(err)
	}
}

func TestBeginKeyValidation(t *testing.T) {
	t.Parallel()
	s, pool := newStore(t, idem.Options{MinKeyLength: 20})
	ctx := context.Background()
	cases := map[string]error{
		"":                          idem.ErrKeyMissing,
		"xxx":                       idem.ErrKeyTooShort,
		strings.Repeat("k", 256):    idem.ErrKeyTooLong,
		"with\nnewline-and-padding": idem.ErrKeyInvalid,
		"bad\xffutf8-and-padding!!": idem.ErrKeyInvalid,
	}
	for key, want := range cases {
		if _, err := s.Begin(ctx, req(key)); !errors.Is(err, want) {
			t.Errorf("key %q: want %v, got %v", key, want, err)
		}
		if got := idem.StatusOf(want); got != 400 {
			t.Errorf("%v maps to %d", want, got)
		}
	}
	if _, err := s.Begin(ctx, req(strings.Repeat("é", 255))); err != nil {
		t.Fatalf("255 characters must pass: %v", err)
	}
	// The minimum applies to new keys only: an existing short key (written
	// under an older policy) is still found and continued.
	if _, err := pool.Exec(ctx, `INSERT INTO idempotency_keys (idempotency_key, user_id, locked_at,
		request_method, request_path, request_params, recovery_point)
		VALUES ('old', 7, NULL, 'POST', '/things', '{"amount":100,"lat":1.5}', 'started')`); err != nil {
		t.Fatal(err)
	}
	k, err := s.Begin(ctx, req("old"))
	if err != nil {
		t.Fatalf("existing short key: %v", err)
	}
	r := readKey(t, pool, k.ID)
	if !r.Locked || r.Fingerprint == nil || r.Upstream == nil {
		t.Fatalf("legacy key not adopted: %+v", r)
	}
}

func TestBeginParamsMismatch(t *testing.T) {
	t.Parallel()
	s, _ := newStore(t, idem.Options{})
	ctx := context.Background()
	k, err := s.Begin(ctx, req("key-m"))
	if err != nil {
		t.Fatal(err)
	}
	s.Unlock(ctx, k)
	for name, r := range map[string]idem.Request{
		"params": {UserID: 7, Key: "key-m", Method: "POST", Path: "/things", Params: params{Amount: 101, Lat: 1.5}},
		"path":   {UserID: 7, Key: "key-m", Method: "POST", Path: "/other", Params: params{Amount: 100, Lat: 1.5}},
		"method": {UserID: 7, Key: "key-m", Method: "PUT", Path: "/things", Params: params{Amount: 100, Lat: 1.5}},
	} {
		if _, err := s.Begin(ctx, r); !errors.Is(err, idem.ErrParamsMismatch) {
			t.Errorf("%s: want ErrParamsMismatch, got %v", name, err)
		}
	}
	if idem.StatusOf(idem.ErrParamsMismatch) != 422 {
		t.Error("params mismatch must be 422")
	}
	// The same logical params spelled differently (JSON numbers) match.
	same := idem.Request{UserID: 7, Key: "key-m", Method: "post", Path: "/things",
		Params: map[string]any{"lat": 1.50, "amount": 100.0}}
	if _, err := s.Begin(ctx, same); err != nil {
		t.Fatalf("equivalent params: %v", err)
	}
}

func TestBeginLegacyKeyWithoutFingerprintComparesParams(t *testing.T) {
	t.Parallel()
	s, pool := newStore(t, idem.Options{})
	ctx := context.Background()
	// JSONB re-spells numbers and reorders keys; comparison is canonical.
	if _, err := pool.Exec(ctx, `INSERT INTO idempotency_keys (idempotency_key, user_id, locked_at,
		request_method, request_path, request_params, recovery_point)
		VALUES ('legacy', 7, NULL, 'POST', '/things', '{"lat": 1.50, "amount": 1.0e2}', 'started')`); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Begin(ctx, req("legacy")); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `UPDATE idempotency_keys SET locked_at = NULL, request_fingerprint = NULL`); err != nil {
		t.Fatal(err)
	}
	bad := req("legacy")
	bad.Params = params{Amount: 100, Lat: 2}
	if _, err := s.Begin(ctx, bad); !errors.Is(err, idem.ErrParamsMismatch) {
		t.Fatalf("want mismatch, got %v", err)
	}
}

func TestLockTimeoutTakeover(t *testing.T) {
	t.Parallel()
	s, pool := newStore(t, idem.Options{})
	ctx := context.Background()
	k, err := s.Begin(ctx, req("key-stale"))
	if err != nil {
		t.Fatal(err)
	}
	// Just inside the timeout: still in progress (database clock).
	if _, err := pool.Exec(ctx, `UPDATE idempotency_keys SET locked_at = now() - interval '89 seconds' WHERE id = $1`, k.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Begin(ctx, req("key-stale")); !errors.Is(err, idem.ErrInProgress) {
		t.Fatalf("want in progress, got %v", err)
	}
	if _, err := pool.Exec(ctx, `UPDATE idempotency_keys SET locked_at = now() - interval '91 seconds' WHERE id = $1`, k.ID); err != nil {
		t.Fatal(err)
	}
	k2, err := s.Begin(ctx, req("key-stale"))
	if err != nil {
		t.Fatalf("stale lock must be taken over: %v", err)
	}
	// The original request wakes up: its writes check the lock and stop.
	err = s.Phase(ctx, k, func(ctx context.Context, tx pgx.Tx, k *idem.Key) (idem.Result, error) {
		return idem.RecoveryPoint("step_1"), nil
	})
	if !errors.Is(err, idem.ErrLockLost) {
		t.Fatalf("old holder: want ErrLockLost, got %v", err)
	}
	if r := readKey(t, pool, k2.ID); r.RecoveryPoint != "started" || !r.Locked {
		t.Fatalf("new holder's lock disturbed: %+v", r)
	}
}

func TestExecuteStoresAndReplaysByteForByte(t *testing.T) {
	t.Parallel()
	s, pool := newStore(t, idem.Options{})
	ctx := context.Background()
	for _, tc := range []struct {
		key    string
		status int
		body   string
	}{
		{"key-201", 201, "{ \"message\" :\t\"ok\",\n \"z\":1, \"a\":2 }"},
		{"key-500", 500, `{"error":"stored failure"}`},
		{"key-402", 402, `not even json`},
	} {
		runs := 0
		phases := idem.Phases{
			"started": func(ctx context.Context, tx pgx.Tx, k *idem.Key) (idem.Result, error) {
				runs++
				return idem.RecoveryPoint("middle"), nil
			},
			"middle": func(ctx context.Context, tx pgx.Tx, k *idem.Key) (idem.Result, error) {
				runs++
				return idem.Response(tc.status, []byte(tc.body)), nil
			},
		}
		out, err := s.Execute(ctx, req(tc.key), phases)
		if err != nil {
			t.Fatal(err)
		}
		if out.Replayed || out.Status != tc.status || string(out.Body) != tc.body || runs != 2 {
			t.Fatalf("first run: %+v runs=%d", out, runs)
		}
		out, err = s.Execute(ctx, req(tc.key), phases)
		if err != nil {
			t.Fatal(err)
		}
		if !out.Replayed || out.Status != tc.status || string(out.Body) != tc.body || runs != 2 {
			t.Fatalf("replay: status %d body %q replayed %v runs=%d", out.Status, out.Body, out.Replayed, runs)
		}
		if r := readKey(t, pool, out.Key.ID); r.Locked || r.RecoveryPoint != "finished" {
			t.Fatalf("finished key row %+v", r)
		}
	}
}

func TestPhaseErrorUnlocksAndKeepsRecoveryPoint(t *testing.T) {
	t.Parallel()
	s, pool := newStore(t, idem.Options{})
	ctx := context.Background()
	boom := errors.New("boom")
	phases := idem.Phases{
		"started": func(ctx context.Context, tx pgx.Tx, k *idem.Key) (idem.Result, error) {
			return idem.RecoveryPoint("middle"), nil
		},
		"middle": func(ctx context.Context, tx pgx.Tx, k *idem.Key) (idem.Result, error) {
			if _, err := tx.Exec(ctx, `INSERT INTO staged_jobs (job_name, job_args) VALUES ('x', '{}')`); err != nil {
				return nil, err
			}
			return nil, boom
		},
	}
	_, err := s.Execute(ctx, req("key-err"), phases)
	if !errors.Is(err, boom) || idem.StatusOf(err) != 500 {
		t.Fatalf("want boom/500, got %v", err)
	}
	var id int64
	if err := pool.QueryRow(ctx, `SELECT id FROM idempotency_keys`).Scan(&id); err != nil {
		t.Fatal(err)
	}
	if r := readKey(t, pool, id); r.Locked || r.RecoveryPoint != "middle" {
		t.Fatalf("row %+v", r)
	}
	var staged int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM staged_jobs`).Scan(&staged); err != nil || staged != 0 {
		t.Fatalf("rolled-back phase left %d staged jobs (%v)", staged, err)
	}

	// ResponseError: answered, not stored, key unlocked and retryable.
	phases["middle"] = func(ctx context.Context, tx pgx.Tx, k *idem.Key) (idem.Result, error) {
		return nil, &idem.ResponseError{Status: 503, Body: []byte(`{"error":"later"}`)}
	}
	_, err = s.Execute(ctx, req("key-err"), phases)
	var re *idem.ResponseError
	if !errors.As(err, &re) || idem.StatusOf(err) != 503 {
		t.Fatalf("want ResponseError 503, got %v", err)
	}
	if r := readKey(t, pool, id); r.Locked || r.RecoveryPoint != "middle" || r.Code != nil {
		t.Fatalf("row %+v", r)
	}
	// And the retry completes from "middle".
	phases["middle"] = func(ctx context.Context, tx pgx.Tx, k *idem.Key) (idem.Result, error) {
		return idem.Response(201, []byte(`{}`)), nil
	}
	out, err := s.Execute(ctx, req("key-err"), phases)
	if err != nil || out.Status != 201 {
		t.Fatalf("%+v %v", out, err)
	}
}

func TestSerializationFailureRetriedThenConflict(t *testing.T) {
	t.Parallel()
	s, pool := newStore(t, idem.Options{MaxSerializationRetries: 2})
	ctx := context.Background()
	serr := &pgconn.PgError{Code: "40001", Message: "could not serialize access"}

	attempts := 0
	phases := idem.Phases{"started": func(ctx context.Context, tx pgx.Tx, k *idem.Key) (idem.Result, error) {
		attempts++
		if attempts == 1 {
			return nil, serr
		}
		return idem.Response(201, []byte(`{}`)), nil
	}}
	if out, err := s.Execute(ctx, req("key-retry"), phases); err != nil || out.Status != 201 || attempts != 2 {
		t.Fatalf("transient failure not retried: %v attempts=%d", err, attempts)
	}

	attempts = 0
	phases["started"] = func(ctx context.Context, tx pgx.Tx, k *idem.Key) (idem.Result, error) {
		attempts++
		return nil, serr
	}
	_, err := s.Execute(ctx, req("key-conflict"), phases)
	if !errors.Is(err, idem.ErrConflict) || idem.StatusOf(err) != 409 || attempts != 3 {
		t.Fatalf("want ErrConflict after 3 attempts, got %v after %d", err, attempts)
	}
	var locked bool
	if err := pool.QueryRow(ctx, `SELECT locked_at IS NOT NULL FROM idempotency_keys WHERE idempotency_key = 'key-conflict'`).Scan(&locked); err != nil || locked {
		t.Fatalf("key left locked (%v)", err)
	}
}

// TestRealSerializationConflict makes two phases of different keys read and
// then write the same rows so PostgreSQL's SSI aborts one; the package must
// retry it transparently. SERIALIZABLE phases are the store's option for
// phase logic that relies on it (TestReadCommittedPhasesMustLockTheirRows
// is the same pattern under the default).
func TestRealSerializationConflict(t *testing.T) {
	t.Parallel()
	s, pool := newStore(t, idem.Options{Isolation: idem.Serializable})
	ctx := context.Background()
	// The application's own table, created as the migrator so the default
	// privileges grant it to the runtime role the store runs as.
	if _, err := dbtest.MigratorPool(t, pool).Exec(ctx, `CREATE TABLE counters (name TEXT PRIMARY KEY, n INT NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	var (
		readA, readB = make(chan struct{}), make(chan struct{})
		onceA, onceB sync.Once
		attempts     = map[string]int{}
		mu           sync.Mutex
	)
	phase := func(name string, mine, theirs chan struct{}, once *sync.Once) idem.Phases {
		return idem.Phases{"started": func(ctx context.Context, tx pgx.Tx, k *idem.Key) (idem.Result, error) {
			mu.Lock()
			attempts[name]++
			mu.Unlock()
			var n int
			if err := tx.QueryRow(ctx, `SELECT count(*) FROM counters`).Scan(&n); err != nil {
				return nil, err
			}
			// First attempt only: wait until both have read, so each
			// one's insert conflicts with the other's read.
			once.Do(func() { close(mine); <-theirs })
			if _, err := tx.Exec(ctx, `INSERT INTO counters VALUES ($1, $2)`, name, n); err != nil {
				return nil, err
			}
			return idem.Response(201, []byte(name)), nil
		}}
	}
	errs := make(chan error, 2)
	go func() { _, err := s.Execute(ctx, req("key-ssi-a"), phase("a", readA, readB, &onceA)); errs <- err }()
	go func() { _, err := s.Execute(ctx, req("key-ssi-b"), phase("b", readB, readA, &onceB)); errs <- err }()
	for range 2 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if attempts["a"]+attempts["b"] < 3 {
		t.Fatalf("expected one side to be retried, attempts %v", attempts)
	}
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM counters`).Scan(&n); err != nil || n != 2 {
		t.Fatalf("counters %d (%v)", n, err)
	}
}

func TestConcurrentBeginOneWinner(t *testing.T) {
	t.Parallel()
	s, _ := newStore(t, idem.Options{})
	ctx := context.Background()
	const n = 20
	var wg sync.WaitGroup
	start := make(chan struct{})
	results := make(chan error, n)
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			_, err := s.Begin(ctx, req("key-race"))
			results <- err
		}()
	}
	close(start)
	wg.Wait()
	close(results)
	won := 0
	for err := range results {
		switch {
		case err == nil:
			won++
		case errors.Is(err, idem.ErrInProgress), errors.Is(err, idem.ErrConflict):
		default:
			t.Errorf("unexpected %v", err)
		}
	}
	if won != 1 {
		t.Fatalf("%d requests locked the key", won)
	}
}

func TestStageJob(t *testing.T) {
	t.Parallel()
	s, pool := newStore(t, idem.Options{})
	ctx := context.Background()
	phases := idem.Phases{"started": func(ctx context.Context, tx pgx.Tx, k *idem.Key) (idem.Result, error) {
		if _, err := idem.StageJob(ctx, tx, "plain", map[string]int{"a": 1}, nil); err != nil {
			return nil, err
		}
		if _, err := idem.StageJob(ctx, tx, "full", struct {
			B string `json:"b"`
		}{"x"}, &idem.StageOptions{Queue: "q", Priority: 2, MaxAttempts: 5, Tags: []string{"t1"}, Metadata: []byte(`{"m":1}`)}); err != nil {
			return nil, err
		}
		return idem.Response(201, nil), nil
	}}
	if _, err := s.Execute(ctx, req("key-stage"), phases); err != nil {
		t.Fatal(err)
	}
	rows, err := pool.Query(ctx, `SELECT job_name, job_args::text, queue, priority, max_attempts, tags, metadata::text
		FROM staged_jobs ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	type row struct {
		Name, Args         string
		Queue              *string
		Priority, Attempts *int
		Tags               []string
		Metadata           *string
	}
	got, err := pgx.CollectRows(rows, pgx.RowToStructByPos[row])
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0].Name != "plain" || got[0].Args != `{"a": 1}` || got[0].Queue != nil || got[0].Priority != nil || got[0].Tags != nil || got[0].Metadata != nil {
		t.Fatalf("plain row %+v", got)
	}
	g := got[1]
	if g.Name != "full" || *g.Queue != "q" || *g.Priority != 2 || *g.Attempts != 5 || g.Tags[0] != "t1" || *g.Metadata != `{"m": 1}` {
		t.Fatalf("full row %+v", g)
	}
}

func TestCanonicalParamsSurviveJSONB(t *testing.T) {
	t.Parallel()
	pool := dbtest.NewPool(t)
	ctx := context.Background()
	for _, doc := range []string{
		`{"origin_lat":37.7749,"origin_lon":-122.4194,"target_lat":0,"target_lon":1e-7}`,
		`{"a":[1,2.50,{"z":"é","y":null}],"n":12345678901234567,"f":0.1}`,
	} {
		c, err := idem.CanonicalJSON([]byte(doc))
		if err != nil {
			t.Fatal(err)
		}
		var back string
		if err := pool.QueryRow(ctx, `SELECT $1::jsonb::text`, string(c)).Scan(&back); err != nil {
			t.Fatal(err)
		}
		c2, err := idem.CanonicalJSON([]byte(back))
		if err != nil || string(c2) != string(c) {
			t.Fatalf("JSONB round trip changed %s into %s (%v)", c, c2, err)
		}
	}
}
