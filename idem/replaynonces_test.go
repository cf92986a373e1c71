package idem_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemd/idemd/idem"
	"github.com/idemd/idemd/idem/replayauth"
	"github.com/idemd/idemd/internal/testing/dbtest"
	"github.com/idemd/idemd/internal/testing/replaytest"
)

// apiInstance is one replica of an API: its own pool on the shared
// database, its own idem.Store, its own verifier (NewVerifier's default,
// so ReplayAuth records nonces in PostgreSQL) and its own HTTP server.
type apiInstance struct {
	pool  *pgxpool.Pool
	store *idem.Store
	srv   *httptest.Server
	logs  *syncBuffer
}

func newAPIInstance(t *testing.T, dbURL string, secret replayauth.Secret) *apiInstance {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), dbURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	logs := &syncBuffer{}
	store := idem.New(pool, idem.Options{Logger: slog.New(slog.NewTextHandler(logs, nil))})
	verifier, err := replayauth.NewVerifier(0, secret)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(store.ReplayAuth(verifier)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, ok := idem.ReplayUserID(r.Context()); !ok {
			http.Error(w, "not a replay", http.StatusTeapot)
		}
	})))
	t.Cleanup(srv.Close)
	return &apiInstance{pool: pool, store: store, srv: srv, logs: logs}
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// twoInstances sets up user 7's unfinished key "open-key" on POST /things
// in a fresh database and two API instances on it.
func twoInstances(t *testing.T) (a, b *apiInstance, signer *replayauth.Signer, pool *pgxpool.Pool) {
	t.Helper()
	pool = dbtest.NewPool(t)
	if _, err := pool.Exec(context.Background(), `INSERT INTO idempotency_keys (idempotency_key, user_id, locked_at,
			request_method, request_path, request_params, recovery_point)
		VALUES ('open-key', 7, NULL, 'POST', '/things', '{}', 'started')`); err != nil {
		t.Fatal(err)
	}
	secret, err := replayauth.NewSecret([]byte(strings.Repeat("s", 32)))
	if err != nil {
		t.Fatal(err)
	}
	if signer, err = replayauth.NewSigner(secret); err != nil {
		t.Fatal(err)
	}
	dbURL := pool.Config().ConnString()
	return newAPIInstance(t, dbURL, secret), newAPIInstance(t, dbURL, secret), signer, pool
}

var replayClient = &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}, Timeout: 30 * time.Second}

// post sends a signed replay of user 7's open-key and returns the status.
func post(srv *httptest.Server, sig string, body []byte) (int, error) {
	r, err := http.NewRequest("POST", srv.URL+"/things", bytes.NewReader(body))
	if err != nil {
		return 0, err
	}
	r.Header.Set(replayauth.IdempotencyKeyHeader, "open-key")
	r.Header.Set(replayauth.Header, sig)
	resp, err := replayClient.Do(r)
	if err != nil {
		return 0, err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode, nil
}

func mustPost(t *testing.T, srv *httptest.Server, sig string, body []byte) int {
	t.Helper()
	code, err := post(srv, sig, body)
	if err != nil {
		t.Fatal(err)
	}
	return code
}

func nonceRows(t *testing.T, pool *pgxpool.Pool, nonces []string) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM idemd_replay_nonces WHERE nonce = ANY($1)`, nonces).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// A signed replay accepted by one API replica is refused by another that
// shares the database, in either direction: the nonce is recorded in
// PostgreSQL, not in the process that accepted it.
func TestReplayNonceRefusedByAnotherInstance(t *testing.T) {
	t.Parallel()
	a, b, signer, pool := twoInstances(t)
	body := []byte(`{"amount":1}`)
	for _, c := range []struct {
		name        string
		first, then *apiInstance
	}{{"a then b", a, b}, {"b then a", b, a}} {
		sig := sign(t, signer, "POST", "/things", 7, "open-key", body)
		if code := mustPost(t, c.first.srv, sig, body); code != http.StatusOK {
			t.Fatalf("%s: first use: %d, want 200", c.name, code)
		}
		if code := mustPost(t, c.then.srv, sig, body); code != http.StatusUnauthorized {
			t.Fatalf("%s: the same signature on the other instance: %d, want 401", c.name, code)
		}
		if code := mustPost(t, c.first.srv, sig, body); code != http.StatusUnauthorized {
			t.Fatalf("%s: the same signature again on the first instance: %d, want 401", c.name, code)
		}
		p, err := replaytest.Parse(sig)
		if err != nil {
			t.Fatal(err)
		}
		if n := nonceRows(t, pool, []string{p.Nonce}); n != 1 {
			t.Fatalf("%s: %d rows for the nonce in idemd_replay_nonces, want 1", c.name, n)
		}
	}
}

// 200 distinct valid replays, each sent to both instances at the same
// moment: every one is accepted exactly once (one 200, one 401), and each
// is refused when replayed again on either instance. The oracle beside the
// responses is the table itself: one row per nonce.
func TestConcurrentReplaysAcrossInstancesAcceptedOnce(t *testing.T) {
	t.Parallel()
	a, b, signer, pool := twoInstances(t)
	const n = 200
	body := []byte(`{"amount":2}`)
	sigs := make([]string, n)
	nonces := make([]string, n)
	for i := range sigs {
		sigs[i] = sign(t, signer, "POST", "/things", 7, "open-key", body)
		p, err := replaytest.Parse(sigs[i])
		if err != nil {
			t.Fatal(err)
		}
		nonces[i] = p.Nonce
	}

	type result struct{ a, b int }
	results := make([]result, n)
	errs := make(chan error, 2*n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range sigs {
		for _, inst := range []*apiInstance{a, b} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				code, err := post(inst.srv, sigs[i], body)
				if err != nil {
					errs <- err
					return
				}
				if inst == a {
					results[i].a = code
				} else {
					results[i].b = code
				}
			}()
		}
	}
	close(start)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	acceptedOn := map[string]int{}
	for i, r := range results {
		switch {
		case r.a == http.StatusOK && r.b == http.StatusUnauthorized:
			acceptedOn["a"]++
		case r.b == http.StatusOK && r.a == http.StatusUnauthorized:
			acceptedOn["b"]++
		default:
			t.Fatalf("replay %d: a answered %d, b %d; want one 200 and one 401", i, r.a, r.b)
		}
	}
	t.Logf("accepted on a: %d, on b: %d", acceptedOn["a"], acceptedOn["b"])
	if got := nonceRows(t, pool, nonces); got != n {
		t.Fatalf("%d of the %d nonces in idemd_replay_nonces, want all", got, n)
	}

	// Replayed again, concurrently, on either instance: all refused.
	codes := make([]int, n)
	for i := range sigs {
		inst := a
		if i%2 == 1 {
			inst = b
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			code, err := post(inst.srv, sigs[i], body)
			if err != nil {
				code = -1
			}
			codes[i] = code
		}()
	}
	wg.Wait()
	for i, code := range codes {
		if code != http.StatusUnauthorized {
			t.Fatalf("second replay of %d: %d, want 401", i, code)
		}
	}
	if got := nonceRows(t, pool, nonces); got != n {
		t.Fatalf("after the replays: %d rows, want %d", got, n)
	}
	for _, inst := range []*apiInstance{a, b} {
		if st := inst.store.ReplayNonces().Stats(); st.UseErrors != 0 {
			t.Fatalf("nonce store errors: %+v", st)
		}
	}
}

type testClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *testClock) now() time.Time      { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *testClock) add(d time.Duration) { c.mu.Lock(); c.t = c.t.Add(d); c.mu.Unlock() }

// Expired rows are deleted by their own expiry, in bounded batches run
// from Use at most once per interval (by the injected clock) and again at
// once while batches come back full; rows still in their window or grace
// stay.
func TestReplayNoncesCleanupDeletesExpiredOnly(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := dbtest.NewPool(t)
	clk := &testClock{t: time.Unix(1_800_000_000, 0)}
	const batch = 100
	store := idem.NewReplayNoncesWithClock(pool, idem.ReplayNoncesOptions{
		CleanupInterval: time.Minute, CleanupBatch: batch, Grace: time.Minute,
	}, clk.now)
	// Ages are the database's: expiries relative to its clock.
	var dbNow time.Time
	if err := pool.QueryRow(ctx, `SELECT now()`).Scan(&dbNow); err != nil {
		t.Fatal(err)
	}
	fill := func(prefix string, count int, expires time.Time) {
		t.Helper()
		if _, err := pool.Exec(ctx, `INSERT INTO idemd_replay_nonces (nonce, expires_at)
			SELECT $1 || g, $2 FROM generate_series(1, $3) g`, prefix, expires, count); err != nil {
			t.Fatal(err)
		}
	}
	count := func(where string) int {
		t.Helper()
		var n int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM idemd_replay_nonces WHERE `+where).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	use := func(nonce string) {
		t.Helper()
		fresh, err := store.Use(ctx, nonce, dbNow.Add(5*time.Minute))
		if err != nil || !fresh {
			t.Fatalf("Use(%s): fresh %v, err %v", nonce, fresh, err)
		}
	}
	expired := `nonce LIKE 'expired-%'`
	fill("expired-", 2*batch+50, dbNow.Add(-10*time.Minute)) // past expiry and grace
	fill("grace-", 10, dbNow.Add(-20*time.Second))           // expired, within the grace
	fill("live-", 10, dbNow.Add(5*time.Minute))              // still in their window

	use("used-1") // the first Use cleans: a full batch ...
	if got := count(expired); got != batch+50 {
		t.Fatalf("after the first cleanup: %d expired rows, want %d", got, batch+50)
	}
	use("used-2") // ... so the next Use cleans again at once (same clock) ...
	use("used-3") // ... until a batch is not full.
	if got := count(expired); got != 0 {
		t.Fatalf("after three cleanups: %d expired rows, want 0", got)
	}

	fill("expired-late-", 20, dbNow.Add(-10*time.Minute))
	use("used-4") // not due: the last batch was not full
	clk.add(59 * time.Second)
	use("used-5") // still not due
	if got := count(expired); got != 20 {
		t.Fatalf("cleanup ran before its interval: %d expired rows, want 20", got)
	}
	clk.add(time.Second)
	use("used-6") // due
	if got := count(expired); got != 0 {
		t.Fatalf("after the interval: %d expired rows, want 0", got)
	}

	if got := count(`nonce LIKE 'grace-%'`); got != 10 {
		t.Fatalf("%d rows within the grace period left, want 10", got)
	}
	if got := count(`nonce LIKE 'live-%' OR nonce LIKE 'used-%'`); got != 16 {
		t.Fatalf("%d live rows left, want 16", got)
	}
	if st := store.Stats(); st.Deleted != 2*batch+50+20 || st.CleanupErrors != 0 || st.UseErrors != 0 {
		t.Fatalf("stats %+v, want %d deleted and no errors", st, 2*batch+50+20)
	}
	// A live nonce is still a replay; a deleted one could be recorded
	// again (its signature is long past the window, so the verifier never
	// gets that far).
	if fresh, err := store.Use(ctx, "live-1", dbNow.Add(5*time.Minute)); err != nil || fresh {
		t.Fatalf("live-1 again: fresh %v err %v, want a replay", fresh, err)
	}
}

// Nothing counts rows: with more live nonces than the old in-memory
// ceiling (100,000) in the table, a fresh nonce is accepted.
func TestReplayNoncesNoCeiling(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := dbtest.NewPool(t)
	if _, err := pool.Exec(ctx, `INSERT INTO idemd_replay_nonces (nonce, expires_at)
		SELECT 'bulk-' || g, now() + interval '5 minutes' FROM generate_series(1, 100001) g`); err != nil {
		t.Fatal(err)
	}
	store := idem.NewReplayNonces(pool, idem.ReplayNoncesOptions{})
	for i := range 10 {
		fresh, err := store.Use(ctx, fmt.Sprintf("new-%d", i), time.Now().Add(5*time.Minute))
		if err != nil || !fresh {
			t.Fatalf("new nonce %d with 100,001 live ones stored: fresh %v, err %v", i, fresh, err)
		}
	}
	if fresh, err := store.Use(ctx, "bulk-7", time.Now().Add(5*time.Minute)); err != nil || fresh {
		t.Fatalf("bulk-7: fresh %v, err %v; want a replay", fresh, err)
	}
}

// When the nonce cannot be recorded the request is refused with 503 (fail
// closed; the completer retries a 5xx), counted, and the outage is logged
// once, however many requests it refuses, with one line when it is over.
func TestReplayAuthFailsClosedWhenNoncesCannotBeRecorded(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	a, _, signer, pool := twoInstances(t)
	admin := dbtest.AdminPool(t, pool)
	var role string
	if err := pool.QueryRow(ctx, `SELECT current_user`).Scan(&role); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Exec(ctx, `REVOKE INSERT ON idemd_replay_nonces FROM `+role); err != nil {
		t.Fatal(err)
	}
	body := []byte(`{}`)
	const refused = 5
	for i := range refused {
		if code := mustPost(t, a.srv, sign(t, signer, "POST", "/things", 7, "open-key", body), body); code != http.StatusServiceUnavailable {
			t.Fatalf("request %d while nonces cannot be recorded: %d, want 503", i, code)
		}
	}
	if st := a.store.ReplayNonces().Stats(); st.UseErrors != refused {
		t.Fatalf("UseErrors %d, want %d", st.UseErrors, refused)
	}
	if n := strings.Count(a.logs.String(), "cannot record replay nonces"); n != 1 {
		t.Fatalf("outage logged %d times, want once:\n%s", n, a.logs.String())
	}

	if _, err := admin.Exec(ctx, `GRANT INSERT ON idemd_replay_nonces TO `+role); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if code := mustPost(t, a.srv, sign(t, signer, "POST", "/things", 7, "open-key", body), body); code != http.StatusOK {
			t.Fatalf("after recovery: %d, want 200", code)
		}
	}
	logs := a.logs.String()
	if strings.Count(logs, "cannot record replay nonces") != 1 || strings.Count(logs, "recording replay nonces works again") != 1 {
		t.Fatalf("want one outage line and one recovery line:\n%s", logs)
	}
	if !strings.Contains(logs, "failures=5") {
		t.Fatalf("recovery line does not count the %d refused requests:\n%s", refused, logs)
	}
}
