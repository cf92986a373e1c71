package completer

import (
	"bytes"
	"context"
	"encoding/hex"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/idemd/idemd/internal/backoff"
	"github.com/idemd/idemd/internal/opshttp"
	"github.com/idemd/idemd/internal/review"
	"github.com/idemd/idemd/internal/testing/dbtest"
	"github.com/idemd/idemd/internal/testing/testwait"
)

func TestRunOnceClassifiesOutcomes(t *testing.T) {
	pool := dbtest.NewPool(t)
	ctx := context.Background()
	acts := map[string]action{
		"c-1": actFinish, "c-2": actFinish402, "c-3": actFinish500, "c-4": actConflict,
		"c-5": actFail500, "c-6": actFail503, "c-7": actUnauthorized, "c-8": actBadRequest, "c-9": actHang,
	}
	keys := insertKeys(t, pool, "c", len(acts), "started")
	api := newTestAPI(t, pool, func(k string, _ int) action { return acts[k] })
	cfg := testConfig(api.srv.URL)
	cfg.RequestTimeout = 300 * time.Millisecond
	cfg.Lease = 10 * time.Second
	cfg.BatchSize = 100
	// The keys' own locks are an hour old; the 409 key's, taken by the
	// test API, is younger than this: a live request holds it.
	cfg.LockTimeout = time.Minute
	reg := prometheus.NewRegistry()
	cfg.Registry = reg
	svc := newTestService(t, pool, cfg)

	res, err := svc.RunOnce(ctx)
	if err != nil {
		t.Fatal(err)
	}
	want := Result{Claimed: 9, Finished: 3, InProgress: 1, Retried: 3, Unauthorized: 1, Rejected: 1}
	if *res != want {
		t.Fatalf("result %+v, want %+v", res, want)
	}
	for _, k := range keys {
		r := getKey(t, pool, k)
		if r.Leased != nil {
			t.Errorf("%s: lease not cleared", k)
		}
		switch acts[k] {
		case actFinish, actFinish402, actFinish500:
			if r.RecoveryPoint != "finished" || r.Attempts != 0 {
				t.Errorf("%s: %+v, want finished without attempts", k, r)
			}
		case actConflict:
			if r.Attempts != 0 || r.NextAttempt == nil || r.LastError != nil {
				t.Errorf("%s: 409 must not count an attempt and must delay: %+v", k, r)
			}
		default:
			if r.Attempts != 1 || r.NextAttempt == nil || r.LastError == nil {
				t.Fatalf("%s: want one recorded attempt: %+v", k, r)
			}
		}
	}
	for k, want := range map[string]string{
		"c-5": "500", "c-6": "503", "c-7": "--auth-secret-file", "c-8": "400", "c-9": "timeout",
	} {
		if got := *getKey(t, pool, k).LastError; !strings.Contains(got, want) {
			t.Errorf("%s last_error %q does not mention %q", k, got, want)
		}
	}
	// 409: next attempt in the future, so an immediate pass leaves it.
	api.setBehave(always(actFinish))
	res, err = svc.RunOnce(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if res.Claimed != 5 || res.Finished != 5 {
		t.Fatalf("second pass %+v: want the 5 failed keys retried and finished, the 409 key left", res)
	}
	if got := getKey(t, pool, "c-4").RecoveryPoint; got == "finished" {
		t.Fatal("in-progress key was replayed before its delay")
	}
	if got := testutil.ToFloat64(svc.metrics.replays.WithLabelValues("finished")); got != 8 {
		t.Fatalf("finished metric %v, want 8", got)
	}
}

func TestConnectionErrorIsRetried(t *testing.T) {
	pool := dbtest.NewPool(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens: connection refused
	insertKeys(t, pool, "n", 2, "started")
	svc := newTestService(t, pool, testConfig("http://"+addr))
	res, err := svc.RunOnce(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if res.Retried != 2 {
		t.Fatalf("%+v", res)
	}
	r := getKey(t, pool, "n-1")
	if r.Attempts != 1 || r.LastError == nil || !strings.Contains(*r.LastError, "request failed") {
		t.Fatalf("%+v", r)
	}
}

// A failed attempt waits backoff.Delay: full jitter below a ceiling that
// doubles from --backoff-base up to --backoff-max.
func TestBackoffFullJitter(t *testing.T) {
	base, maxD := time.Second, 40*time.Second
	top := func(n int64) int64 { return n - 1 }
	for attempt, want := range map[int]time.Duration{1: time.Second, 2: 2 * time.Second, 3: 4 * time.Second, 6: 32 * time.Second, 7: 40 * time.Second, 100: 40 * time.Second, 0: time.Second} {
		if got := backoff.Delay(attempt, base, maxD, top); got != want-1 {
			t.Errorf("attempt %d: ceiling %v, want %v", attempt, got+1, want)
		}
	}
	if got := backoff.Delay(5, base, maxD, func(int64) int64 { return 0 }); got != 0 {
		t.Errorf("full jitter must reach 0, got %v", got)
	}
	// Any jitter stays within [0, ceiling).
	for i := range 1000 {
		attempt := 1 + i%10
		d := backoff.Delay(attempt, base, maxD, func(n int64) int64 { return int64(i*7919) % n })
		ceil := min(base<<(attempt-1), maxD)
		if d < 0 || d >= ceil {
			t.Fatalf("attempt %d: %v outside [0,%v)", attempt, d, ceil)
		}
	}
}

func TestGiveUpAfterMaxAttemptsFlagsForReview(t *testing.T) {
	pool := dbtest.NewPool(t)
	ctx := context.Background()
	insertKeys(t, pool, "g", 1, "charge_created")
	api := newTestAPI(t, pool, always(actFail500))
	cfg := testConfig(api.srv.URL)
	cfg.MaxAttempts = 3
	svc := newTestService(t, pool, cfg)
	var outcomes []Outcome
	for range 3 {
		res, err := svc.RunOnce(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if res.Claimed != 1 {
			t.Fatalf("pass %d claimed %d", len(outcomes), res.Claimed)
		}
		if res.GaveUp == 1 {
			outcomes = append(outcomes, OutcomeGaveUp)
		} else {
			outcomes = append(outcomes, OutcomeRetry)
		}
	}
	if outcomes[2] != OutcomeGaveUp || outcomes[1] != OutcomeRetry {
		t.Fatalf("outcomes %v", outcomes)
	}
	r := getKey(t, pool, "g-1")
	if r.GaveUp == nil || r.Attempts != 3 || r.Leased != nil {
		t.Fatalf("%+v", r)
	}
	var reason, detail, by string
	if err := pool.QueryRow(ctx, `SELECT reason, detail, flagged_by FROM idempotency_key_reviews WHERE idempotency_key = 'g-1'`).Scan(&reason, &detail, &by); err != nil {
		t.Fatal(err)
	}
	if reason != review.ReasonCompleterGaveUp || by != "completer" || !strings.Contains(detail, "3 failed attempts") || !strings.Contains(detail, "500") {
		t.Fatalf("review %q %q %q", reason, detail, by)
	}
	res, err := svc.RunOnce(ctx)
	if err != nil || res.Claimed != 0 {
		t.Fatalf("a given-up key must not be claimed again: %+v %v", res, err)
	}
	if api.requests() != 3 {
		t.Fatalf("requests %d", api.requests())
	}
}

func TestGiveUpPastHorizonWithoutReplaying(t *testing.T) {
	pool := dbtest.NewPool(t)
	ctx := context.Background()
	insertKeys(t, pool, "h", 2, "started")
	if _, err := pool.Exec(ctx, `UPDATE idempotency_keys SET created_at = now() - interval '23 hours 1 minute' WHERE idempotency_key = 'h-1'`); err != nil {
		t.Fatal(err)
	}
	api := newTestAPI(t, pool, always(actFinish))
	svc := newTestService(t, pool, testConfig(api.srv.URL))
	res, err := svc.RunOnce(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if res.GaveUp != 1 || res.Finished != 1 {
		t.Fatalf("%+v", res)
	}
	if api.requests() != 1 {
		t.Fatalf("a key past the horizon must not be replayed; %d requests", api.requests())
	}
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM idempotency_key_reviews WHERE idempotency_key = 'h-1' AND reason = $1 AND detail LIKE '%horizon%'`, review.ReasonCompleterGaveUp).Scan(&n); err != nil || n != 1 {
		t.Fatalf("review count %d %v", n, err)
	}
}

func TestCandidateFilters(t *testing.T) {
	pool := dbtest.NewPool(t)
	ctx := context.Background()
	insertKeys(t, pool, "f", 7, "started")
	for _, q := range []string{
		`UPDATE idempotency_keys SET created_at = now() - interval '1 minute' WHERE idempotency_key = 'f-1'`,                                                       // within grace
		`UPDATE idempotency_keys SET last_run_at = now() - interval '10 seconds' WHERE idempotency_key = 'f-2'`,                                                    // ran recently
		`UPDATE idempotency_keys SET locked_at = now() - interval '30 seconds' WHERE idempotency_key = 'f-3'`,                                                      // live lock
		`UPDATE idempotency_keys SET completer_next_attempt_at = now() + interval '1 minute' WHERE idempotency_key = 'f-4'`,                                        // backing off
		`UPDATE idempotency_keys SET completer_leased_until = now() + interval '1 minute' WHERE idempotency_key = 'f-5'`,                                           // leased
		`UPDATE idempotency_keys SET recovery_point = 'finished' WHERE idempotency_key = 'f-6'`,                                                                    // done
		`UPDATE idempotency_keys SET locked_at = now() - interval '2 minutes', completer_leased_until = now() - interval '1 second' WHERE idempotency_key = 'f-7'`, // stale lock, expired lease: due
	} {
		if _, err := pool.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	api := newTestAPI(t, pool, always(actFinish))
	cfg := testConfig(api.srv.URL)
	cfg.Grace, cfg.Idle, cfg.LockTimeout = 5*time.Minute, time.Minute, 90*time.Second
	svc := newTestService(t, pool, cfg)
	res, err := svc.RunOnce(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if res.Claimed != 1 || getKey(t, pool, "f-7").RecoveryPoint != "finished" {
		t.Fatalf("%+v", res)
	}
}

// Three replicas pass over the same keys at once: every key is replayed exactly
// once and never by two replicas at the same time.
func TestLeaseExclusivityAcrossReplicas(t *testing.T) {
	pool := dbtest.NewPool(t)
	ctx := context.Background()
	const n = 1500
	insertKeys(t, pool, "x", n, "started")
	api := newTestAPI(t, pool, always(actFinish))
	var wg sync.WaitGroup
	totals := make([]Result, 3)
	for i := range 3 {
		cfg := testConfig(api.srv.URL)
		cfg.BatchSize = 37
		svc := newTestService(t, pool, cfg)
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, err := svc.RunOnce(ctx)
			if err != nil {
				t.Error(err)
			}
			totals[i] = *res
		}()
	}
	wg.Wait()
	claimed := 0
	for _, r := range totals {
		claimed += r.Claimed
		if r.LeaseLost != 0 || r.Retried != 0 {
			t.Errorf("replica result %+v", r)
		}
	}
	if claimed != n {
		t.Fatalf("claimed %d keys in total, want %d (each exactly once)", claimed, n)
	}
	api.mu.Lock()
	defer api.mu.Unlock()
	if api.overlaps != 0 {
		t.Fatalf("%d concurrent replays of one key", api.overlaps)
	}
	for k, c := range api.perKey {
		if c != 1 {
			t.Fatalf("key %s replayed %d times", k, c)
		}
	}
	if len(api.perKey) != n || countWhere(t, pool, "recovery_point = 'finished'") != n {
		t.Fatalf("replayed %d keys", len(api.perKey))
	}
	for _, r := range totals {
		if r.Claimed == 0 {
			t.Logf("note: one replica claimed nothing (%+v)", totals)
		}
	}
}

// A replica whose lease was taken over writes nothing.
func TestWritesCheckTheLease(t *testing.T) {
	pool := dbtest.NewPool(t)
	ctx := context.Background()
	insertKeys(t, pool, "l", 1, "started")
	api := newTestAPI(t, pool, always(actFail500))
	a := newTestService(t, pool, testConfig(api.srv.URL))
	b := newTestService(t, pool, testConfig(api.srv.URL))

	keys, err := a.claim(ctx, 10)
	if err != nil || len(keys) != 1 {
		t.Fatalf("claim: %v %d", err, len(keys))
	}
	if again, err := b.claim(ctx, 10); err != nil || len(again) != 0 {
		t.Fatalf("second replica claimed a leased key: %v %d", err, len(again))
	}
	// A's lease expires (it stalled); B takes the key over.
	if _, err := pool.Exec(ctx, `UPDATE idempotency_keys SET completer_leased_until = now() - interval '1 second'`); err != nil {
		t.Fatal(err)
	}
	bkeys, err := b.claim(ctx, 10)
	if err != nil || len(bkeys) != 1 {
		t.Fatalf("takeover claim: %v %d", err, len(bkeys))
	}
	// A now finishes its stale work: it must not record anything.
	if o := a.process(ctx, keys[0], time.Now().Add(time.Minute)); o != OutcomeLeaseLost {
		t.Fatalf("stale replica outcome %s", o)
	}
	if r := getKey(t, pool, "l-1"); r.Attempts != 0 || r.LastError != nil || r.Leased == nil {
		t.Fatalf("stale replica wrote: %+v", r)
	}
	if o := b.process(ctx, bkeys[0], time.Now().Add(time.Minute)); o != OutcomeRetry {
		t.Fatalf("owner outcome %s", o)
	}
	if r := getKey(t, pool, "l-1"); r.Attempts != 1 {
		t.Fatalf("%+v", r)
	}
}

// The limiter's schedule obeys the token bucket, and the API really sees no
// more than burst + rate·elapsed requests.
func TestRateLimit(t *testing.T) {
	pool := dbtest.NewPool(t)
	const n, rateHz, burst = 60, 50.0, 5
	insertKeys(t, pool, "r", n, "started")
	api := newTestAPI(t, pool, always(actFinish))
	cfg := testConfig(api.srv.URL)
	cfg.Rate, cfg.Burst, cfg.Concurrency, cfg.BatchSize = rateHz, burst, 8, 20
	svc := newTestService(t, pool, cfg)
	var mu sync.Mutex
	var acts []time.Time
	svc.hooks.reserved = func(at time.Time) { mu.Lock(); acts = append(acts, at); mu.Unlock() }
	start := time.Now()
	res, err := svc.RunOnce(context.Background())
	if err != nil || res.Finished != n {
		t.Fatalf("%+v %v", res, err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(acts) != n {
		t.Fatalf("%d reservations", len(acts))
	}
	sortTimes(acts)
	for i := range acts {
		for j := i; j < len(acts); j++ {
			allowed := float64(burst) + rateHz*acts[j].Sub(acts[i]).Seconds() + 1e-6
			if float64(j-i+1) > allowed {
				t.Fatalf("%d requests scheduled within %v: over the limit", j-i+1, acts[j].Sub(acts[i]))
			}
		}
	}
	api.mu.Lock()
	last := api.arrivals[len(api.arrivals)-1]
	api.mu.Unlock()
	if minElapsed := time.Duration(float64(n-burst) / rateHz * float64(time.Second)); last.Sub(start) < minElapsed {
		t.Fatalf("%d requests arrived within %v, the limit allows no fewer than %v", n, last.Sub(start), minElapsed)
	}
}

func sortTimes(ts []time.Time) {
	for i := 1; i < len(ts); i++ {
		for j := i; j > 0 && ts[j].Before(ts[j-1]); j-- {
			ts[j], ts[j-1] = ts[j-1], ts[j]
		}
	}
}

// The breaker opens after consecutive failures, sends one probe per
// (doubling) cool-down while the API is down, and closes on recovery.
func TestBreakerOpensProbesAndRecovers(t *testing.T) {
	pool := dbtest.NewPool(t)
	ctx := context.Background()
	insertKeys(t, pool, "b", 10, "started")
	api := newTestAPI(t, pool, always(actFail503))
	cfg := testConfig(api.srv.URL)
	cfg.Concurrency = 1
	cfg.BreakerFailures = 3
	cfg.BreakerCooldown, cfg.BreakerMaxCooldown = time.Minute, 3*time.Minute
	reg := prometheus.NewRegistry()
	cfg.Registry = reg
	svc := newTestService(t, pool, cfg)
	clock := &fakeClock{t: time.Now()}
	svc.now = clock.Now

	// One batch at a time: a pass would carry on after the recovery probe.
	batch := func() *Result {
		t.Helper()
		res, err := svc.runBatch(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	res := batch()
	if res.Retried != 3 || res.Deferred != 7 || api.requests() != 3 {
		t.Fatalf("opening pass %+v, %d requests", res, api.requests())
	}
	if s := testutil.ToFloat64(svc.metrics.breakerState); s != float64(BreakerOpen) {
		t.Fatalf("breaker gauge %v", s)
	}
	if r := countWhere(t, pool, "completer_leased_until IS NOT NULL"); r != 0 {
		t.Fatalf("%d deferred keys still leased", r)
	}
	if res := batch(); !res.BreakerOpen || res.Claimed != 0 || api.requests() != 3 {
		t.Fatalf("open breaker let requests through: %+v", res)
	}
	clock.Advance(time.Minute)
	if res := batch(); res.Claimed != 1 || res.Retried != 1 || api.requests() != 4 {
		t.Fatalf("half-open probe %+v, %d requests", res, api.requests())
	}
	clock.Advance(time.Minute) // cool-down doubled to 2m: still open
	if res := batch(); !res.BreakerOpen || api.requests() != 4 {
		t.Fatalf("breaker did not double its cool-down: %+v", res)
	}
	clock.Advance(time.Minute)
	api.setBehave(always(actFinish))
	if res := batch(); res.Finished != 1 || res.Claimed != 1 {
		t.Fatalf("recovery probe %+v", res)
	}
	if svc.breaker.State() != BreakerClosed {
		t.Fatal("breaker did not close")
	}
	if res := batch(); res.Finished != 9 {
		t.Fatalf("after recovery %+v", res)
	}
	if got := testutil.ToFloat64(svc.metrics.breakerOpens); got != 2 {
		t.Fatalf("opens %v", got)
	}
}

// A pass that meets the half-open breaker claims one probe, and when the
// probe closes the breaker it goes on draining at once rather than waiting
// a poll interval.
func TestPassCarriesOnAfterRecoveryProbe(t *testing.T) {
	pool := dbtest.NewPool(t)
	ctx := context.Background()
	insertKeys(t, pool, "pr", 10, "started")
	api := newTestAPI(t, pool, always(actFail503))
	cfg := testConfig(api.srv.URL)
	cfg.Concurrency = 1
	cfg.BreakerFailures = 3
	cfg.BreakerCooldown, cfg.BreakerMaxCooldown = time.Minute, time.Minute
	svc := newTestService(t, pool, cfg)
	clock := &fakeClock{t: time.Now()}
	svc.now = clock.Now
	res, err := svc.RunOnce(ctx)
	if err != nil || res.Retried != 3 || res.Deferred != 7 || res.Probe {
		t.Fatalf("opening pass %+v %v", res, err)
	}
	if res, err := svc.RunOnce(ctx); err != nil || !res.BreakerOpen || res.Claimed != 0 {
		t.Fatalf("pass with the breaker open %+v %v", res, err)
	}
	clock.Advance(time.Minute)
	api.setBehave(always(actFinish))
	res, err = svc.RunOnce(ctx)
	if err != nil || !res.Probe || res.Claimed != 10 || res.Finished != 10 {
		t.Fatalf("recovery pass %+v %v: want the probe, then every key", res, err)
	}
}

// The API goes down while the completer runs (real clock, Start/Stop): it
// never sends more than the breaker allows, respects the rate limit, and
// drains everything once the API is back.
func TestAPIDownThenRecovers(t *testing.T) {
	pool := dbtest.NewPool(t)
	const n = 200
	insertKeys(t, pool, "d", n, "started")
	api := newTestAPI(t, pool, always(actFail503))
	cfg := testConfig(api.srv.URL)
	cfg.Rate, cfg.Burst = 400, 10
	cfg.Concurrency = 4
	cfg.BreakerFailures = 3
	cfg.BreakerCooldown, cfg.BreakerMaxCooldown = 20*time.Millisecond, 80*time.Millisecond
	reg := prometheus.NewRegistry()
	cfg.Registry = reg
	svc := newTestService(t, pool, cfg)
	var mu sync.Mutex
	var acts []time.Time
	svc.hooks.reserved = func(at time.Time) { mu.Lock(); acts = append(acts, at); mu.Unlock() }
	svc.signals.breakerOpened.Init(t)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := svc.Start(ctx); err != nil {
		t.Fatal(err)
	}
	// Down until the breaker has re-opened on failed probes several times.
	for range 4 {
		svc.signals.breakerOpened.WaitOrTimeout(t)
	}
	api.mu.Lock()
	api.behave = always(actFinish)
	downRequests := api.total
	api.mu.Unlock()
	opens := int(testutil.ToFloat64(svc.metrics.breakerOpens))
	testwait.Until(t, 60*time.Second, "all keys finished", func() bool {
		return countWhere(t, pool, "recovery_point = 'finished'") == n
	})
	stopCtx, stopCancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer stopCancel()
	if err := svc.Stop(stopCtx); err != nil {
		t.Fatal(err)
	}
	// While down: the first opening lets at most threshold + in-flight
	// requests fail; after that each re-opening is one failed probe. One
	// more probe may have been in flight when we switched the API back.
	if limit := cfg.BreakerFailures + cfg.Concurrency - 1 + opens; downRequests > limit {
		t.Fatalf("%d requests while down with %d openings; the breaker allows at most %d", downRequests, opens, limit)
	}
	mu.Lock()
	defer mu.Unlock()
	sortTimes(acts)
	for i := range acts {
		for j := i + 1; j < len(acts) && j < i+200; j++ {
			if float64(j-i+1) > float64(cfg.Burst)+cfg.Rate*acts[j].Sub(acts[i]).Seconds()+1e-6 {
				t.Fatalf("rate limit exceeded between reservations %d and %d", i, j)
			}
		}
	}
	if api.overlaps != 0 {
		t.Fatal("overlapping replays")
	}
}

func TestStartStopDrainsAndIsIdempotent(t *testing.T) {
	pool := dbtest.NewPool(t)
	insertKeys(t, pool, "s", 120, "started")
	api := newTestAPI(t, pool, always(actFinish))
	svc := newTestService(t, pool, testConfig(api.srv.URL))
	ctx, cancel := context.WithCancel(context.Background())
	if err := svc.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if err := svc.Start(ctx); err == nil {
		t.Fatal("second Start must fail")
	}
	testwait.Until(t, 30*time.Second, "drain", func() bool { return countWhere(t, pool, "recovery_point = 'finished'") == 120 })
	// More work arrives later and is picked up by polling.
	insertKeys(t, pool, "s2", 5, "charge_created")
	testwait.Until(t, 30*time.Second, "late keys", func() bool { return countWhere(t, pool, "recovery_point = 'finished'") == 125 })
	cancel()
	if err := svc.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := svc.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
}

func TestStopAbortsHungRequestsAndReleases(t *testing.T) {
	pool := dbtest.NewPool(t)
	insertKeys(t, pool, "sh", 2, "started")
	api := newTestAPI(t, pool, always(actHang))
	cfg := testConfig(api.srv.URL)
	svc := newTestService(t, pool, cfg)
	if err := svc.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	testwait.Until(t, 30*time.Second, "requests in flight", func() bool { return api.requests() == 2 })
	stopCtx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := svc.Stop(stopCtx); err == nil {
		t.Fatal("Stop must report the aborted batch")
	}
	if n := countWhere(t, pool, "completer_leased_until IS NOT NULL OR completer_attempts <> 0"); n != 0 {
		t.Fatalf("%d keys left leased or charged an attempt after shutdown", n)
	}
}

// A started completer refreshes its backlog gauges beside its passes, on
// its own: here keys the API keeps failing stay pending, and the gauge
// shows them without any call of RefreshGauges.
func TestGaugesRefreshBesideThePasses(t *testing.T) {
	pool := dbtest.NewPool(t)
	insertKeys(t, pool, "gs", 4, "started")
	api := newTestAPI(t, pool, always(actFail503))
	cfg := testConfig(api.srv.URL)
	cfg.Registry = prometheus.NewRegistry()
	svc := newTestService(t, pool, cfg)
	if err := svc.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = svc.Stop(context.Background()) })
	testwait.Until(t, 30*time.Second, "the pending gauge to show the four keys", func() bool {
		return testutil.ToFloat64(svc.metrics.pending.WithLabelValues("started")) == 4
	})
}

func TestGauges(t *testing.T) {
	pool := dbtest.NewPool(t)
	insertKeys(t, pool, "ga", 3, "started")
	insertKeys(t, pool, "gb", 2, "ride_created")
	api := newTestAPI(t, pool, always(actFinish))
	cfg := testConfig(api.srv.URL)
	cfg.Registry = prometheus.NewRegistry()
	svc := newTestService(t, pool, cfg)
	if err := svc.RefreshGauges(context.Background()); err != nil {
		t.Fatal(err)
	}
	if v := testutil.ToFloat64(svc.metrics.pending.WithLabelValues("started")); v != 3 {
		t.Fatalf("started %v", v)
	}
	if v := testutil.ToFloat64(svc.metrics.pending.WithLabelValues("ride_created")); v != 2 {
		t.Fatalf("ride_created %v", v)
	}
	if v := testutil.ToFloat64(svc.metrics.oldestAge); v < 3500 || v > 7200 {
		t.Fatalf("oldest age %v, want about an hour", v)
	}
	// No review yet: both reasons exported at 0.
	for _, r := range []string{review.ReasonUnfinishedAtRetention, review.ReasonCompleterGaveUp} {
		if v := testutil.ToFloat64(svc.metrics.openReviews.WithLabelValues(r)); v != 0 {
			t.Fatalf("open reviews %s before any: %v", r, v)
		}
	}
	if v := testutil.ToFloat64(svc.metrics.oldestReview); v != 0 {
		t.Fatalf("oldest review age with none: %v", v)
	}
	// Two open reviews for one reason (the older flagged two days ago), one
	// for the other, and a resolved one that must not count.
	if _, err := pool.Exec(context.Background(), `
INSERT INTO idempotency_key_reviews (key_id, user_id, idempotency_key, reason, snapshot, flagged_by, flagged_at, resolved_at, resolved_by)
VALUES (1, 1, 'r1', $1, '{}', 'test', now() - interval '2 days', NULL, NULL),
       (2, 1, 'r2', $1, '{}', 'test', now(), NULL, NULL),
       (3, 1, 'r3', $2, '{}', 'test', now() - interval '1 hour', NULL, NULL),
       (4, 1, 'r4', $2, '{}', 'test', now() - interval '30 days', now(), 'someone')`,
		review.ReasonUnfinishedAtRetention, review.ReasonCompleterGaveUp); err != nil {
		t.Fatal(err)
	}
	if err := svc.RefreshGauges(context.Background()); err != nil {
		t.Fatal(err)
	}
	if v := testutil.ToFloat64(svc.metrics.openReviews.WithLabelValues(review.ReasonUnfinishedAtRetention)); v != 2 {
		t.Fatalf("open unfinished_at_retention reviews %v, want 2", v)
	}
	if v := testutil.ToFloat64(svc.metrics.openReviews.WithLabelValues(review.ReasonCompleterGaveUp)); v != 1 {
		t.Fatalf("open completer_gave_up reviews %v, want 1 (the resolved one must not count)", v)
	}
	if v := testutil.ToFloat64(svc.metrics.oldestReview); v < 2*86400-60 || v > 2*86400+3600 {
		t.Fatalf("oldest open review age %v, want about two days", v)
	}
	if _, err := svc.RunOnce(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := svc.RefreshGauges(context.Background()); err != nil {
		t.Fatal(err)
	}
	if c := testutil.CollectAndCount(svc.metrics.pending); c != 0 {
		t.Fatalf("pending series after drain: %d", c)
	}
	if v := testutil.ToFloat64(svc.metrics.oldestAge); v != 0 {
		t.Fatalf("oldest age after drain %v", v)
	}
}

func TestFormEncoding(t *testing.T) {
	got, err := formEncode([]byte(`{"b":{"y":2,"x":"a b"},"a":[1,true,null,"z"],"n":null,"amount":1000}`))
	if err != nil {
		t.Fatal(err)
	}
	want := "a%5B0%5D=1&a%5B1%5D=true&a%5B3%5D=z&amount=1000&b%5Bx%5D=a+b&b%5By%5D=2"
	if string(got) != want {
		t.Fatalf("got  %s\nwant %s", got, want)
	}
	if _, err := formEncode([]byte(`[1]`)); err == nil {
		t.Fatal("a JSON array cannot be form-encoded")
	}

	pool := dbtest.NewPool(t)
	insertKeys(t, pool, "fe", 3, "started")
	api := newTestAPI(t, pool, always(actFinish))
	api.form = true
	cfg := testConfig(api.srv.URL)
	cfg.Encoding = EncodingForm
	res, err := newTestService(t, pool, cfg).RunOnce(context.Background())
	if err != nil || res.Finished != 3 {
		t.Fatalf("%+v %v", res, err)
	}
}

// During a rotation the completer signs with both secrets, so an API that
// knows only the old or only the new one accepts it.
func TestSecretRotation(t *testing.T) {
	const oldS, newS = "old-secret-old-secret-old-secret-0001", "new-secret-new-secret-new-secret-0002"
	for name, apiSecret := range map[string]string{"api-old": oldS, "api-new": newS} {
		t.Run(name, func(t *testing.T) {
			pool := dbtest.NewPool(t)
			insertKeys(t, pool, "rot", 2, "started")
			api := newTestAPI(t, pool, always(actFinish), apiSecret)
			cfg := testConfig(api.srv.URL)
			cfg.Signer = testSigner(t, newS, oldS)
			res, err := newTestService(t, pool, cfg).RunOnce(context.Background())
			if err != nil || res.Finished != 2 {
				t.Fatalf("%+v %v", res, err)
			}
		})
	}
	t.Run("wrong-secret", func(t *testing.T) {
		pool := dbtest.NewPool(t)
		insertKeys(t, pool, "rot", 1, "started")
		api := newTestAPI(t, pool, always(actFinish), oldS)
		cfg := testConfig(api.srv.URL)
		cfg.Signer = testSigner(t, newS)
		res, err := newTestService(t, pool, cfg).RunOnce(context.Background())
		if err != nil || res.Unauthorized != 1 {
			t.Fatalf("%+v %v", res, err)
		}
	})
}

// Nothing the completer logs or stores contains a secret or a signature.
func TestSecretsNeverLoggedOrStored(t *testing.T) {
	pool := dbtest.NewPool(t)
	ctx := context.Background()
	insertKeys(t, pool, "sec", 12, "started")
	acts := []action{actFinish, actFail500, actUnauthorized, actBadRequest, actConflict, actFinish500}
	api := newTestAPI(t, pool, func(k string, _ int) action {
		var i int
		for _, c := range k {
			i += int(c)
		}
		return acts[i%len(acts)]
	})
	var buf bytes.Buffer
	var bufMu sync.Mutex
	core := zapcore.NewCore(zapcore.NewJSONEncoder(zap.NewProductionEncoderConfig()), zapcore.AddSync(&lockedWriter{w: &buf, mu: &bufMu}), zapcore.DebugLevel)
	cfg := testConfig(api.srv.URL)
	cfg.Logger = zap.New(core)
	cfg.MaxAttempts = 2
	svc := newTestService(t, pool, cfg)
	for range 4 {
		if _, err := svc.RunOnce(ctx); err != nil {
			t.Fatal(err)
		}
	}
	var stored strings.Builder
	rows, err := pool.Query(ctx, `SELECT coalesce(completer_last_error, '') FROM idempotency_keys
UNION ALL SELECT coalesce(detail, '') || snapshot::text FROM idempotency_key_reviews`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			t.Fatal(err)
		}
		stored.WriteString(s + "\n")
	}
	bufMu.Lock()
	logs := buf.String()
	bufMu.Unlock()
	if !strings.Contains(logs, "will retry") || !strings.Contains(logs, "gave up") {
		t.Fatalf("test did not exercise the failure logs:\n%s", logs)
	}
	forbidden := []string{testSecret, hex.EncodeToString([]byte(testSecret))}
	api.mu.Lock()
	for _, sig := range api.sigs {
		forbidden = append(forbidden, sig)
		for _, part := range strings.Split(sig, ",") {
			if strings.HasPrefix(part, "v1=") || strings.HasPrefix(part, "n=") {
				forbidden = append(forbidden, strings.SplitN(part, "=", 2)[1])
			}
		}
	}
	api.mu.Unlock()
	for _, f := range forbidden {
		if strings.Contains(logs, f) {
			t.Fatalf("logs contain a secret or signature %q", f)
		}
		if strings.Contains(stored.String(), f) {
			t.Fatalf("database contains a secret or signature %q", f)
		}
	}
	if strings.Contains(logs, "v1=") || strings.Contains(stored.String(), "v1=") {
		t.Fatal("a signature header leaked")
	}
}

type lockedWriter struct {
	w  *bytes.Buffer
	mu *sync.Mutex
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// TestStartSetsReadiness: the service, not its command, owns its
// readiness rule: Start marks it started and allows a pass three poll
// intervals and two leases old, and a pass marks it ready.
func TestStartSetsReadiness(t *testing.T) {
	pool := dbtest.NewPool(t)
	api := newTestAPI(t, pool, always(actFinish))
	cfg := testConfig(api.srv.URL)
	cfg.PollInterval, cfg.Lease = 40*time.Millisecond, 30*time.Second
	ready := &opshttp.Readiness{}
	cfg.Ready = ready
	svc := newTestService(t, pool, cfg)
	if err := ready.Check(context.Background(), time.Now()); err != nil {
		t.Fatalf("before Start the rule is not set, so readiness is the database's alone: %v", err)
	}
	if err := svc.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer svc.Stop(context.Background()) //nolint:errcheck
	if want := 3*cfg.PollInterval + 2*cfg.Lease; ready.MaxPassAge() != want {
		t.Fatalf("MaxPassAge %s, want %s", ready.MaxPassAge(), want)
	}
	if err := ready.Check(context.Background(), time.Now().Add(ready.MaxPassAge()+time.Second)); err == nil {
		t.Fatal("ready with no pass for longer than MaxPassAge")
	}
	testwait.Until(t, time.Minute, "a pass to mark readiness", func() bool {
		return ready.Check(context.Background(), time.Now()) == nil
	})
}
