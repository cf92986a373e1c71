package completer

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/zap"

	"github.com/idemd/idemd/examples/rocketrides/api"
	"github.com/idemd/idemd/examples/rocketrides/fakestripe"
	"github.com/idemd/idemd/idem/replayauth"
	"github.com/idemd/idemd/internal/testing/dbtest"
	"github.com/idemd/idemd/internal/testing/testbin"
	"github.com/idemd/idemd/internal/testing/testwait"
)

// rocketRides is the real reference API over HTTP with its fake Stripe as
// the oracle, plus a wrapper that detects two replays of one key in flight.
type rocketRides struct {
	pool    *pgxpool.Pool
	dbURL   string
	stripe  *fakestripe.Server
	faults  *api.Faults
	srv     *httptest.Server
	apiKeys map[int64]string // user id -> bearer key

	mu       sync.Mutex
	inFlight map[string]bool
	overlaps int
	replays  int
}

func newRocketRides(t *testing.T, secrets ...string) *rocketRides {
	t.Helper()
	ctx := context.Background()
	dbURL := dbtest.NewDatabase(t)
	cfg, err := pgxpool.ParseConfig(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 24
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	// Rocket Rides' tables as the migrator (the application's migration
	// in production), so roles.sql's default privileges grant them to the
	// runtime role the test's pool uses.
	if err := api.Migrate(ctx, dbtest.MigratorPool(t, pool)); err != nil {
		t.Fatal(err)
	}
	rr := &rocketRides{pool: pool, dbURL: dbURL, stripe: fakestripe.New(), faults: api.NewFaults(), apiKeys: map[int64]string{}, inFlight: map[string]bool{}}
	stripeSrv := httptest.NewServer(rr.stripe)
	t.Cleanup(stripeSrv.Close)
	if len(secrets) == 0 {
		secrets = []string{testSecret}
	}
	var ss []replayauth.Secret
	for _, s := range secrets {
		ss = append(ss, mustSecret(t, s))
	}
	verifier, err := replayauth.NewVerifier(0, ss...)
	if err != nil {
		t.Fatal(err)
	}
	stripeHTTP := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 32}}
	t.Cleanup(stripeHTTP.CloseIdleConnections)
	h, err := api.New(api.Config{Pool: pool, StripeURL: stripeSrv.URL, StripeKey: "sk_test_fake", Replay: verifier, Faults: rr.faults, StripeHTTPClient: stripeHTTP,
		// A request cut off by a SIGKILLed completer can leave its lock
		// behind (the lock timeout is the backstop); keep it short here.
		LockTimeout: e2eLockTimeout})
	if err != nil {
		t.Fatal(err)
	}
	rr.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key := r.Header.Get(replayauth.IdempotencyKeyHeader)
		signed := r.Header.Get(replayauth.Header) != ""
		if signed {
			rr.mu.Lock()
			rr.replays++
			if rr.inFlight[key] {
				rr.overlaps++
			}
			rr.inFlight[key] = true
			rr.mu.Unlock()
			defer func() { rr.mu.Lock(); delete(rr.inFlight, key); rr.mu.Unlock() }()
		}
		h.ServeHTTP(w, r)
	}))
	t.Cleanup(rr.srv.Close)
	return rr
}

const e2eLockTimeout = 2 * time.Second

func (rr *rocketRides) addUsers(t *testing.T, n int, customerPrefix string) []int64 {
	t.Helper()
	var ids []int64
	for i := range n {
		apiKey := fmt.Sprintf("sk_test_%s_%d_%s", customerPrefix, i, uuid.NewString()[:8])
		id, err := api.CreateUser(context.Background(), rr.pool, fmt.Sprintf("%s-%d@example.com", customerPrefix, i), fmt.Sprintf("%s_%d", customerPrefix, i), apiKey)
		if err != nil {
			t.Fatal(err)
		}
		rr.apiKeys[id] = apiKey
		ids = append(ids, id)
	}
	return ids
}

// abandon sends n ride requests that die at point (the fault switch), as
// clients that gave up would leave them. It returns how many were sent.
func (rr *rocketRides) abandon(t *testing.T, users []int64, n int, point string) {
	t.Helper()
	if point != "" {
		if err := rr.faults.Set(api.FaultRule{At: point, Rate: 1}); err != nil {
			t.Fatal(err)
		}
	} else if err := rr.faults.Set(); err != nil {
		t.Fatal(err)
	}
	form := url.Values{"origin_lat": {"0.0"}, "origin_lon": {"0.0"}, "target_lat": {"37.7749"}, "target_lon": {"-122.4194"}}.Encode()
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 8}}
	defer client.CloseIdleConnections()
	var wg sync.WaitGroup
	var codesMu sync.Mutex
	codes := map[int]int{}
	defer func() { t.Logf("abandon at %q: %v", point, codes) }()
	next := make(chan int)
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				u := users[i%len(users)]
				req, _ := http.NewRequest(http.MethodPost, rr.srv.URL+"/rides", strings.NewReader(form))
				req.Header.Set("Authorization", "Bearer "+rr.apiKeys[u])
				req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
				req.Header.Set("Idempotency-Key", "e2e-"+uuid.NewString())
				resp, err := client.Do(req)
				if err != nil {
					t.Error(err)
					continue
				}
				resp.Body.Close()
				codesMu.Lock()
				codes[resp.StatusCode]++
				codesMu.Unlock()
			}
		}()
	}
	for i := range n {
		next <- i
	}
	close(next)
	wg.Wait()
}

// TestEndToEndRocketRides: thousands of rides abandoned at every recovery
// point, the API down at first and then failing about a quarter of its requests,
// two in-process replicas plus one completer process SIGKILLed again and
// again. Every key ends finished or flagged, Stripe's charges are exactly
// the rides' charges, and no key is charged twice.
func TestEndToEndRocketRides(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end test skipped in -short mode")
	}
	start := time.Now()
	bin := testbin.Build(t, "github.com/idemd/idemd/cmd/completer")
	rr := newRocketRides(t)
	ctx := context.Background()
	users := rr.addUsers(t, 20, "cus_rider")
	decliners := rr.addUsers(t, 3, fakestripe.DeclinePrefix)

	const perPoint = 350
	rr.abandon(t, users, perPoint, api.RecoveryPointStarted)       // dies before the ride
	rr.abandon(t, users, perPoint, api.RecoveryPointRideCreated)   // ride, no charge
	rr.abandon(t, users, perPoint, api.RecoveryPointChargeCreated) // charged, no receipt
	rr.abandon(t, decliners, 60, api.RecoveryPointRideCreated)     // will be declined: a stored 402
	rr.abandon(t, users, 60, "")                                   // finished normally
	// Concurrent requests of one rider may meet a serialization conflict
	// (409), so the counts per point are not exact; each must be large.
	var total int
	byPoint := map[string]int{}
	rows, err := rr.pool.Query(ctx, `SELECT recovery_point, count(*) FROM idempotency_keys GROUP BY 1`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var rp string
		var n int
		if err := rows.Scan(&rp, &n); err != nil {
			t.Fatal(err)
		}
		byPoint[rp] = n
		total += n
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	t.Logf("abandoned keys by recovery point: %v", byPoint)
	for _, rp := range []string{api.RecoveryPointStarted, api.RecoveryPointRideCreated, api.RecoveryPointChargeCreated} {
		if byPoint[rp] < perPoint/2 {
			t.Fatalf("setup: only %d keys at %s", byPoint[rp], rp)
		}
	}
	// Some keys look held by an API process that crashed two minutes ago.
	if _, err := rr.pool.Exec(ctx, `UPDATE idempotency_keys SET locked_at = now() - interval '2 minutes' WHERE id % 10 = 0 AND recovery_point <> 'finished'`); err != nil {
		t.Fatal(err)
	}
	chargesBefore := rr.stripe.ChargeCount()
	t.Logf("setup done after %v", time.Since(start))

	// The API is down at first.
	if err := rr.faults.Set(api.FaultRule{At: api.AtBefore, Rate: 1}); err != nil {
		t.Fatal(err)
	}

	secretFile := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(secretFile, []byte(testSecret), 0o600); err != nil {
		t.Fatal(err)
	}
	flags := []string{
		"--database-url", rr.dbURL, "--api-url", rr.srv.URL, "--auth-secret-file", secretFile,
		"--http-addr", "", "--log-level", "warn",
		"--grace", "0s", "--idle", "0s", "--lock-timeout", e2eLockTimeout.String(),
		"--lease", "6s", "--request-timeout", "2s", "--max-attempts", "25",
		"--backoff-base", "5ms", "--backoff-max", "50ms", "--in-progress-delay", "50ms", "--poll-interval", "20ms",
		"--concurrency", "4", "--rate", "400", "--burst", "20", "--batch-size", "25",
		"--breaker-failures", "8", "--breaker-cooldown", "30ms", "--breaker-max-cooldown", "200ms",
	}

	// Two in-process replicas.
	var reserveMu sync.Mutex
	reservations := map[int][]time.Time{}
	var svcs []*Service
	for i := range 2 {
		cfg := testConfig(rr.srv.URL)
		cfg.LockTimeout = e2eLockTimeout
		cfg.Lease, cfg.RequestTimeout = 6*time.Second, 2*time.Second
		cfg.MaxAttempts = 25
		cfg.BackoffBase, cfg.BackoffMax = 5*time.Millisecond, 50*time.Millisecond
		cfg.PollInterval = 20 * time.Millisecond
		cfg.InProgressDelay = 50 * time.Millisecond
		cfg.Concurrency, cfg.Rate, cfg.Burst, cfg.BatchSize = 4, 400, 20, 25
		cfg.BreakerFailures, cfg.BreakerCooldown, cfg.BreakerMaxCooldown = 8, 30*time.Millisecond, 200*time.Millisecond
		cfg.Registry = prometheus.NewRegistry()
		cfg.Logger = zap.NewNop()
		cfg.Pool, cfg.Signer = rr.pool, testSigner(t)
		svc, err := New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		svc.signals.breakerOpened.Init(t)
		svc.hooks.reserved = func(at time.Time) {
			reserveMu.Lock()
			reservations[i] = append(reservations[i], at)
			reserveMu.Unlock()
		}
		svcs = append(svcs, svc)
	}
	runCtx, cancelRun := context.WithCancel(ctx)
	defer cancelRun()
	for _, s := range svcs {
		if err := s.Start(runCtx); err != nil {
			t.Fatal(err)
		}
	}

	// API down: both replicas' breakers open and re-open on failed probes.
	for _, s := range svcs {
		for range 3 {
			s.signals.breakerOpened.WaitOrTimeout(t)
		}
	}
	rr.mu.Lock()
	downReplays := rr.replays
	rr.mu.Unlock()
	opens := 0
	for _, s := range svcs {
		opens += int(testutil.ToFloat64(s.metrics.breakerOpens))
	}
	// Per replica: at most threshold + in-flight requests before opening,
	// then one probe per re-opening (plus one probe in flight).
	if limit := 2*(8+4-1+1) + opens; downReplays > limit {
		t.Fatalf("%d replays while the API was down (%d breaker openings): a stampede", downReplays, opens)
	}
	// The API comes back, failing about a quarter of its requests (a
	// fault at any of its four points).
	if err := rr.faults.Set(api.FaultRule{Rate: 0.07}); err != nil {
		t.Fatal(err)
	}

	remaining := func() int {
		return countWhere(t, rr.pool, "recovery_point <> 'finished' AND completer_gave_up_at IS NULL")
	}
	// One completer process, SIGKILLed repeatedly once it has made progress.
	for kill := range 4 {
		before := remaining()
		if before < 150 {
			break
		}
		cmd := exec.Command(bin, flags...)
		cmd.Stderr = &strings.Builder{}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		testwait.Until(t, 60*time.Second, fmt.Sprintf("progress before kill %d", kill), func() bool {
			return remaining() < before-60 || remaining() < 60
		})
		if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		_ = cmd.Wait()
	}
	t.Logf("kills done after %v, %d keys left", time.Since(start), remaining())
	// A last process instance stays up until the end and is stopped cleanly.
	final := exec.Command(bin, flags...)
	if err := final.Start(); err != nil {
		t.Fatal(err)
	}
	lastDiag := time.Now()
	testwait.Until(t, 90*time.Second, "every key finished or flagged", func() bool {
		if time.Since(lastDiag) > 5*time.Second {
			lastDiag = time.Now()
			var diag string
			_ = rr.pool.QueryRow(ctx, `SELECT json_agg(x)::text FROM (SELECT recovery_point, locked_at > now() - interval '90 seconds' AS locked, completer_leased_until > now() AS leased, completer_next_attempt_at > now() AS backoff, last_run_at > now() - interval '1 second' AS ranrecently, count(*) FROM idempotency_keys WHERE recovery_point <> 'finished' AND completer_gave_up_at IS NULL GROUP BY 1,2,3,4,5) x`).Scan(&diag)
			var st []string
			for _, s := range svcs {
				st = append(st, fmt.Sprintf("breaker=%v fin=%v retry=%v inprog=%v defer=%v claimed=%v", s.breaker.State(),
					testutil.ToFloat64(s.metrics.replays.WithLabelValues("finished")), testutil.ToFloat64(s.metrics.replays.WithLabelValues("retry")),
					testutil.ToFloat64(s.metrics.replays.WithLabelValues("in_progress")), testutil.ToFloat64(s.metrics.replays.WithLabelValues("deferred")),
					testutil.ToFloat64(s.metrics.claimed)))
			}
			t.Logf("diag: %v %s", st, diag)
		}
		return remaining() == 0
	})
	t.Logf("drained after %v", time.Since(start))
	_ = final.Process.Signal(syscall.SIGTERM)
	if err := final.Wait(); err != nil {
		t.Errorf("completer process after SIGTERM: %v", err)
	}
	stopCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	for _, s := range svcs {
		if err := s.Stop(stopCtx); err != nil {
			t.Error(err)
		}
	}

	// Oracle 1: every key finished or flagged (and flagged ones reviewed).
	var finished, flagged, reviews, code201, code402 int
	if err := rr.pool.QueryRow(ctx, `SELECT
		count(*) FILTER (WHERE recovery_point = 'finished'),
		count(*) FILTER (WHERE completer_gave_up_at IS NOT NULL AND recovery_point <> 'finished'),
		count(*) FILTER (WHERE response_code = 201),
		count(*) FILTER (WHERE response_code = 402)
		FROM idempotency_keys`).Scan(&finished, &flagged, &code201, &code402); err != nil {
		t.Fatal(err)
	}
	if err := rr.pool.QueryRow(ctx, `SELECT count(*) FROM idempotency_key_reviews WHERE reason = 'completer_gave_up'`).Scan(&reviews); err != nil {
		t.Fatal(err)
	}
	if finished+flagged != total || reviews != flagged {
		t.Fatalf("finished %d + flagged %d != %d keys; %d reviews", finished, flagged, total, reviews)
	}
	// Oracle 2: Stripe's succeeded charges are exactly the rides' charges.
	charges := rr.stripe.Charges()
	succeeded := map[string]bool{}
	perUpstream := map[string]int{}
	failedCharges := 0
	for _, c := range charges {
		perUpstream[c.IdempotencyKey]++
		if c.Status == "succeeded" {
			succeeded[c.ID] = true
		} else {
			failedCharges++
		}
	}
	var ridesCharged, ridesWithUnknownCharge int
	rows, err = rr.pool.Query(ctx, `SELECT stripe_charge_id FROM rides WHERE stripe_charge_id IS NOT NULL`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			t.Fatal(err)
		}
		ridesCharged++
		if !succeeded[id] {
			ridesWithUnknownCharge++
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if ridesCharged != len(succeeded) || ridesWithUnknownCharge != 0 {
		t.Fatalf("Stripe has %d succeeded charges, rides record %d (%d unknown to Stripe)", len(succeeded), ridesCharged, ridesWithUnknownCharge)
	}
	// Oracle 3: no key charged twice (one charge per upstream key, one
	// ride per key), and every ride answered 201 is charged.
	for k, n := range perUpstream {
		if n != 1 {
			t.Fatalf("upstream key %s charged %d times", k, n)
		}
	}
	var dupRides, uncharged201 int
	if err := rr.pool.QueryRow(ctx, `SELECT count(*) FROM (SELECT idempotency_key_id FROM rides WHERE idempotency_key_id IS NOT NULL GROUP BY 1 HAVING count(*) > 1) d`).Scan(&dupRides); err != nil {
		t.Fatal(err)
	}
	if err := rr.pool.QueryRow(ctx, `SELECT count(*) FROM idempotency_keys k JOIN rides r ON r.idempotency_key_id = k.id WHERE k.response_code = 201 AND r.stripe_charge_id IS NULL`).Scan(&uncharged201); err != nil {
		t.Fatal(err)
	}
	if dupRides != 0 || uncharged201 != 0 {
		t.Fatalf("%d keys with several rides, %d answered 201 without a charge", dupRides, uncharged201)
	}
	if code201 != len(succeeded) || failedCharges != code402 {
		t.Fatalf("201 answers %d vs succeeded charges %d; 402 answers %d vs declined charges %d", code201, len(succeeded), code402, failedCharges)
	}
	rr.mu.Lock()
	overlaps := rr.overlaps
	rr.mu.Unlock()
	if overlaps != 0 {
		t.Fatalf("%d replays of a key while another was in flight", overlaps)
	}
	// The in-process replicas kept to their rate limit throughout.
	reserveMu.Lock()
	for i, acts := range reservations {
		sortTimes(acts)
		for a := range acts {
			for b := a + 1; b < len(acts) && b < a+100; b++ {
				if float64(b-a+1) > 20+400*acts[b].Sub(acts[a]).Seconds()+1e-6 {
					t.Fatalf("replica %d exceeded its rate limit", i)
				}
			}
		}
	}
	reserveMu.Unlock()
	t.Logf("%d keys: %d finished, %d flagged; charges before %d, after %d; %d replays (%d while down, %d breaker openings)",
		total, finished, flagged, chargesBefore, len(charges), rr.replays, downReplays, opens)
}
