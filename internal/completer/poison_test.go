package completer

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/idemd/idemd/internal/review"
	"github.com/idemd/idemd/internal/testing/dbtest"
)

func TestClassifyFailure(t *testing.T) {
	for _, c := range []struct {
		name         string
		failedBefore bool
		epoch, succ  uint64
		want         failureKind
	}{
		{"first failure", false, 0, 7, apiFailure},
		{"failed again, nothing answered since (outage lasts)", true, 3, 3, apiFailure},
		{"failed again after other keys succeeded", true, 3, 4, keyFailure},
		{"failed before this process, nothing answered yet", true, 0, 0, apiFailure},
	} {
		if got := classifyFailure(c.failedBefore, c.epoch, c.succ); got != c.want {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
	}
}

// A key that keeps failing while others succeed opens nothing, breaks no
// streak and, as a half-open probe, re-opens nothing; a real outage still
// opens the breaker and keeps it open.
func TestBreakerIgnoresAKeysOwnFailures(t *testing.T) {
	clock := &fakeClock{t: time.Unix(1_000_000, 0)}
	b := newBreaker(clock.Now, 3, time.Minute, 4*time.Minute, nil)
	const bad = 1
	allowFail := func(id int64, attempts int) failureKind {
		t.Helper()
		if !b.Allow() {
			t.Fatalf("key %d not allowed in state %v", id, b.State())
		}
		return b.Failed(id, attempts)
	}
	allowOK := func(id int64) {
		t.Helper()
		if !b.Allow() {
			t.Fatalf("key %d not allowed in state %v", id, b.State())
		}
		b.Succeeded(id)
	}
	if k := allowFail(bad, 0); k != apiFailure {
		t.Fatalf("a first failure is evidence about the API: %v", k)
	}
	allowOK(2)
	if !b.Suspect(bad, 1) || b.Suspect(3, 0) {
		t.Fatal("suspect: the failed key after a success, not a fresh one")
	}
	for i := range 10 {
		if k := allowFail(bad, 1+i); k != keyFailure {
			t.Fatalf("failure %d of the bad key taken for %v", i, k)
		}
	}
	if b.State() != BreakerClosed {
		t.Fatal("one key's failures opened the breaker")
	}
	// Outage: fresh keys fail (the bad key's failures in between change
	// nothing); threshold of them opens.
	allowFail(10, 0)
	allowFail(bad, 11)
	allowFail(11, 0)
	allowFail(bad, 12)
	allowFail(12, 0)
	if b.State() != BreakerOpen {
		t.Fatalf("outage did not open: %v", b.State())
	}
	clock.Advance(time.Minute)
	// A suspect probe (chosen only when nothing better is due) fails on its
	// own: the breaker stays half-open for a probe that tells something.
	if k := allowFail(bad, 13); k != keyFailure || b.State() != BreakerHalfOpen {
		t.Fatalf("suspect probe: %v, state %v", k, b.State())
	}
	// A fresh key still failing: the API is down, cool-down doubles.
	if k := allowFail(10, 1); k != apiFailure || b.State() != BreakerOpen || b.Remaining() != 2*time.Minute {
		t.Fatalf("failed probe: %v, state %v, remaining %v", k, b.State(), b.Remaining())
	}
	clock.Advance(2 * time.Minute)
	allowOK(11)
	if b.State() != BreakerClosed {
		t.Fatal("successful probe did not close")
	}
	b.Forget(bad)
	if b.Suspect(bad, 0) {
		t.Fatal("a forgotten key with no attempts is not suspect")
	}
}

func TestChooseProbes(t *testing.T) {
	cands := []probeCandidate{{ID: 1, Attempts: 3}, {ID: 2}, {ID: 3, Attempts: 1}, {ID: 4}, {ID: 5}}
	suspect := func(id int64, _ int) bool { return id == 5 }
	got := chooseProbes(cands, suspect)
	// 5 is suspect (last); 4 and 2 have no attempts, 4 is newer.
	if want := []int64{4, 2, 3, 1, 5}; !slices.Equal(got, want) {
		t.Fatalf("%v, want %v", got, want)
	}
}

func TestDispatchOrder(t *testing.T) {
	var keys []claimedKey
	for i := range 7 {
		keys = append(keys, claimedKey{ID: int64(i + 1)})
	}
	got := dispatchOrder(keys, func(id int64, _ int) bool { return id == 2 })
	var ids []int64
	for _, k := range got {
		ids = append(ids, k.ID)
	}
	if want := []int64{1, 7, 3, 6, 4, 5, 2}; !slices.Equal(ids, want) {
		t.Fatalf("%v, want %v", ids, want)
	}
}

// Poison keys (older than everything, the API answers 500 for them every
// time) are present before, during and after a payment-service outage that
// rightly opens the breaker. After the same number of passes (the breaker's
// clock and every backoff advanced by hand between passes, no wall time),
// as many healthy keys are finished as without them; the poison keys back
// off on their own and are given up and flagged.
func TestPoisonKeysDoNotHoldBackHealthyKeys(t *testing.T) {
	without := poisonScenario(t, 0)
	with1 := poisonScenario(t, 1)
	with10 := poisonScenario(t, 10)
	t.Logf("healthy keys finished after each pass: without poison %v, 1 poison key %v, 10 poison keys %v", without, with1, with10)
	if !slices.Equal(with1, without) || !slices.Equal(with10, without) {
		t.Fatalf("poison keys held healthy ones back: without %v, with 1 %v, with 10 %v", without, with1, with10)
	}
}

const (
	poisonEarly   = 100 // healthy keys before the outage
	poisonHealthy = 300 // healthy keys abandoned during the outage
	poisonStep    = 20 * time.Second
)

// poisonScenario runs the scenario with n poison keys and returns the
// healthy keys finished after each pass.
func poisonScenario(t *testing.T, n int) []int {
	t.Helper()
	pool := dbtest.NewPool(t)
	ctx := context.Background()
	if n > 0 {
		insertKeys(t, pool, "poison", n, "started") // oldest: claimed first
	}
	insertKeys(t, pool, "early", poisonEarly, "started")
	down := false
	api := newTestAPI(t, pool, func(key string, _ int) action {
		switch {
		case strings.HasPrefix(key, "poison-"):
			return actFail500 // whatever the payment service does
		case down:
			return actFail503
		}
		return actFinish
	})
	setDown := func(d bool) { api.mu.Lock(); down = d; api.mu.Unlock() }
	cfg := testConfig(api.srv.URL)
	cfg.Concurrency = 1 // outcomes in dispatch order: the streaks are exact
	cfg.BatchSize = 50
	cfg.BreakerFailures = 5
	cfg.BreakerCooldown, cfg.BreakerMaxCooldown = poisonStep, 6*poisonStep
	cfg.BackoffBase, cfg.BackoffMax = time.Minute, time.Hour
	cfg.MaxAttempts = 6
	svc := newTestService(t, pool, cfg)
	svc.jitter = func(n int64) int64 { return n - 1 } // a retry waits its full backoff
	clock := &fakeClock{t: time.Unix(1_000_000, 0)}
	svc.now = clock.Now

	var finished []int
	pass := func() {
		t.Helper()
		// Time passes: the breaker's clock, and every backoff in the
		// database expires (poison keys are due again at every pass, the
		// worst case).
		clock.Advance(poisonStep)
		if _, err := pool.Exec(ctx, `UPDATE idempotency_keys SET completer_next_attempt_at = now() WHERE completer_next_attempt_at > now()`); err != nil {
			t.Fatal(err)
		}
		if _, err := svc.RunOnce(ctx); err != nil {
			t.Fatal(err)
		}
		finished = append(finished, countWhere(t, pool, "recovery_point = 'finished' AND idempotency_key NOT LIKE 'poison-%'"))
	}

	pass() // before the outage
	setDown(true)
	insertKeys(t, pool, "h", poisonHealthy, "started")
	for range 4 { // opens, then failed probes double the cool-down
		pass()
	}
	setDown(false)
	for range 8 {
		pass()
	}
	if f := finished[len(finished)-1]; f != poisonEarly+poisonHealthy {
		t.Fatalf("%d poison keys: %d healthy keys finished of %d (%v)", n, f, poisonEarly+poisonHealthy, finished)
	}
	if g := countWhere(t, pool, "idempotency_key LIKE 'poison-%' AND completer_gave_up_at IS NOT NULL AND completer_attempts = $1", cfg.MaxAttempts); g != n {
		t.Fatalf("%d of %d poison keys given up after %d attempts", g, n, cfg.MaxAttempts)
	}
	var flagged int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM idempotency_key_reviews WHERE reason = $1 AND flagged_by = 'completer' AND idempotency_key LIKE 'poison-%'`, review.ReasonCompleterGaveUp).Scan(&flagged); err != nil {
		t.Fatal(err)
	}
	if flagged != n {
		t.Fatalf("%d of %d poison keys flagged", flagged, n)
	}
	if api.overlaps != 0 {
		t.Fatal("overlapping replays")
	}
	// Failures taken for the poison keys' own are counted, and only theirs:
	// without poison keys every failure was the API's.
	if kf := testutil.ToFloat64(svc.metrics.keyFailures); (n == 0) != (kf == 0) {
		t.Fatalf("%d poison keys: idemd_completer_key_failures_total %v", n, kf)
	}
	return finished
}
