package completer

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/zap"

	"github.com/idemd/idemd/idem/replayauth"
	"github.com/idemd/idemd/internal/testing/dbtest"
)

func TestMain(m *testing.M) { dbtest.Main(m) }

// testSecret is 32+ bytes; tests assert it never appears in logs.
const testSecret = "completer-test-secret-0123456789abcdef-SENTINEL"

func mustSecret(t testing.TB, s string) replayauth.Secret {
	t.Helper()
	sec, err := replayauth.NewSecret([]byte(s))
	if err != nil {
		t.Fatal(err)
	}
	return sec
}

func testSigner(t testing.TB, secrets ...string) *replayauth.Signer {
	t.Helper()
	if len(secrets) == 0 {
		secrets = []string{testSecret}
	}
	var ss []replayauth.Secret
	for _, s := range secrets {
		ss = append(ss, mustSecret(t, s))
	}
	sg, err := replayauth.NewSigner(ss...)
	if err != nil {
		t.Fatal(err)
	}
	return sg
}

// action is what the test API does with one request.
type action int

const (
	actFinish       action = iota // finish the key with code 200 and answer 200
	actFinish402                  // finish with a stored 402 and answer 402
	actFinish500                  // finish with a stored 500 and answer 500
	actConflict                   // lock the key as a live request would, answer 409
	actMismatch                   // answer 409 without locking the key (the article's parameter mismatch)
	actFail500                    // answer 500, leave the key
	actFail503                    // answer 503, leave the key
	actUnauthorized               // answer 401, leave the key
	actBadRequest                 // answer 400, leave the key
	actHang                       // block until the client gives up
)

// testAPI is an API stand-in: it verifies the replay signature exactly as
// the contract says (existing unfinished key of the signed user, else 401),
// then does what behave says. It records every request and detects two
// requests for one key in flight at once.
type testAPI struct {
	t        testing.TB
	pool     *pgxpool.Pool
	verifier *replayauth.Verifier
	srv      *httptest.Server
	form     bool
	// refuseType answers a body of the wrong Content-Type (400 when 0).
	refuseType int

	mu        sync.Mutex
	behave    func(key string, n int) action
	perKey    map[string]int
	inFlight  map[string]bool
	overlaps  int
	total     int
	arrivals  []time.Time
	sigs      []string
	badSig    int
	hangStop  chan struct{}
	hangClose sync.Once
}

func newTestAPI(t testing.TB, pool *pgxpool.Pool, behave func(key string, n int) action, secrets ...string) *testAPI {
	t.Helper()
	if len(secrets) == 0 {
		secrets = []string{testSecret}
	}
	var ss []replayauth.Secret
	for _, s := range secrets {
		ss = append(ss, mustSecret(t, s))
	}
	v, err := replayauth.NewVerifier(0, ss...)
	if err != nil {
		t.Fatal(err)
	}
	a := &testAPI{t: t, pool: pool, verifier: v, behave: behave, perKey: map[string]int{}, inFlight: map[string]bool{}, hangStop: make(chan struct{})}
	a.srv = httptest.NewServer(http.HandlerFunc(a.serve))
	t.Cleanup(func() {
		a.hangClose.Do(func() { close(a.hangStop) })
		a.srv.Close()
	})
	return a
}

func (a *testAPI) setBehave(f func(key string, n int) action) {
	a.mu.Lock()
	a.behave = f
	a.mu.Unlock()
}

func (a *testAPI) requests() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.total
}

func (a *testAPI) serve(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	key := r.Header.Get(replayauth.IdempotencyKeyHeader)
	sig := r.Header.Get(replayauth.Header)
	a.mu.Lock()
	a.total++
	a.arrivals = append(a.arrivals, time.Now())
	a.sigs = append(a.sigs, sig)
	a.mu.Unlock()

	wantCT := "application/json"
	if a.form {
		wantCT = "application/x-www-form-urlencoded"
	}
	if r.Header.Get("Content-Type") != wantCT {
		code := a.refuseType
		if code == 0 {
			code = http.StatusBadRequest
		}
		http.Error(w, "bad content type", code)
		return
	}
	uid, err := a.verifier.Verify(r.Context(), sig, replayauth.Request{Method: r.Method, Path: r.URL.Path, IdempotencyKey: key, Body: body})
	if err != nil {
		a.mu.Lock()
		a.badSig++
		a.mu.Unlock()
		http.Error(w, "unauthorized", http.StatusUnauthorized)
		return
	}
	ctx := r.Context()
	var id int64
	var params []byte
	err = a.pool.QueryRow(ctx, `
UPDATE idempotency_keys SET last_run_at = now()
WHERE user_id = $1 AND idempotency_key = $2 AND recovery_point <> 'finished'
RETURNING id, request_params`, uid, key).Scan(&id, &params)
	if err != nil {
		http.Error(w, "unauthorized", http.StatusUnauthorized)
		return
	}
	if a.form {
		want, _ := formEncode(params)
		if !bytes.Equal(want, body) {
			http.Error(w, "body differs from stored params", http.StatusBadRequest)
			return
		}
		if _, err := url.ParseQuery(string(body)); err != nil {
			http.Error(w, "bad form", http.StatusBadRequest)
			return
		}
	} else if !jsonEqual(params, body) {
		http.Error(w, "body differs from stored params", http.StatusBadRequest)
		return
	}

	a.mu.Lock()
	if a.inFlight[key] {
		a.overlaps++
	}
	a.inFlight[key] = true
	a.perKey[key]++
	n := a.perKey[key]
	act := a.behave(key, n)
	a.mu.Unlock()
	defer func() {
		a.mu.Lock()
		delete(a.inFlight, key)
		a.mu.Unlock()
	}()

	finish := func(code int) {
		if _, err := a.pool.Exec(ctx, `
UPDATE idempotency_keys SET recovery_point = 'finished', response_code = $2, response_body = '{}', locked_at = NULL
WHERE id = $1 AND recovery_point <> 'finished'`, id, code); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.WriteHeader(code)
		_, _ = w.Write([]byte("{}"))
	}
	switch act {
	case actFinish:
		finish(200)
	case actFinish402:
		finish(402)
	case actFinish500:
		finish(500)
	case actConflict:
		if _, err := a.pool.Exec(ctx, `UPDATE idempotency_keys SET locked_at = now() WHERE id = $1`, id); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		http.Error(w, "in progress", http.StatusConflict)
	case actMismatch:
		http.Error(w, "parameters differ from the key's", http.StatusConflict)
	case actFail500:
		http.Error(w, "boom", http.StatusInternalServerError)
	case actFail503:
		http.Error(w, "down", http.StatusServiceUnavailable)
	case actUnauthorized:
		http.Error(w, "no", http.StatusUnauthorized)
	case actBadRequest:
		http.Error(w, "bad", http.StatusBadRequest)
	case actHang:
		select {
		case <-ctx.Done():
		case <-a.hangStop:
		}
	}
}

func jsonEqual(a, b []byte) bool {
	var x, y any
	if json.Unmarshal(a, &x) != nil || json.Unmarshal(b, &y) != nil {
		return false
	}
	xb, _ := json.Marshal(x)
	yb, _ := json.Marshal(y)
	return bytes.Equal(xb, yb)
}

func always(a action) func(string, int) action { return func(string, int) action { return a } }

// testConfig is a Config for tests: no grace, immediate retries (with the
// zero jitter set by newTestService), a breaker that never opens.
func testConfig(apiURL string) Config {
	c := Config{Settings: DefaultSettings()}
	c.APIURL = apiURL
	c.Grace, c.Idle, c.LockTimeout = 0, 0, 0
	c.Lease = 30 * time.Second
	c.RequestTimeout = 10 * time.Second
	c.BackoffBase, c.BackoffMax = time.Millisecond, time.Millisecond
	c.Concurrency = 4
	c.Rate, c.Burst = 100000, 1000
	c.BatchSize = 50
	c.PollInterval = 10 * time.Millisecond
	c.BreakerFailures = 1 << 30
	return c
}

func newTestService(t testing.TB, pool *pgxpool.Pool, cfg Config) *Service {
	t.Helper()
	if cfg.Signer == nil {
		cfg.Signer = testSigner(t)
	}
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	cfg.Pool = pool
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	s.jitter = func(int64) int64 { return 0 } // retries due at once
	return s
}

// insertKeys writes n abandoned keys at recovery point rp, created an hour
// ago, and returns their idempotency_key values (prefix-1 ... prefix-n).
func insertKeys(t testing.TB, pool *pgxpool.Pool, prefix string, n int, rp string) []string {
	t.Helper()
	rows, err := pool.Query(context.Background(), `
INSERT INTO idempotency_keys (idempotency_key, user_id, request_method, request_path, request_params,
                              recovery_point, created_at, last_run_at, locked_at)
SELECT $1 || '-' || g, 1 + g % 7, 'POST', '/charges',
       jsonb_build_object('amount', 100 + g, 'currency', 'usd', 'meta', jsonb_build_object('n', g, 'tags', jsonb_build_array('a', 'b'))),
       $3, now() - interval '1 hour', now() - interval '1 hour', now() - interval '1 hour'
FROM generate_series(1, $2) g
RETURNING idempotency_key`, prefix, n, rp)
	if err != nil {
		t.Fatal(err)
	}
	var keys []string
	for rows.Next() {
		var k string
		if err := rows.Scan(&k); err != nil {
			t.Fatal(err)
		}
		keys = append(keys, k)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return keys
}

type keyRow struct {
	RecoveryPoint string
	ResponseCode  *int
	Attempts      int
	NextAttempt   *time.Time
	Leased        *time.Time
	LastError     *string
	GaveUp        *time.Time
}

func getKey(t testing.TB, pool *pgxpool.Pool, key string) keyRow {
	t.Helper()
	var r keyRow
	err := pool.QueryRow(context.Background(), `
SELECT recovery_point, response_code, completer_attempts, completer_next_attempt_at,
       completer_leased_until, completer_last_error, completer_gave_up_at
FROM idempotency_keys WHERE idempotency_key = $1`, key).
		Scan(&r.RecoveryPoint, &r.ResponseCode, &r.Attempts, &r.NextAttempt, &r.Leased, &r.LastError, &r.GaveUp)
	if err != nil {
		t.Fatalf("get key %s: %v", key, err)
	}
	return r
}

func countWhere(t testing.TB, pool *pgxpool.Pool, where string, args ...any) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), "SELECT count(*) FROM idempotency_keys WHERE "+where, args...).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// fakeClock is a manually advanced clock for the breaker.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

var _ = strings.Contains
