package api_test

import (
	"context"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"

	"github.com/stripe/stripe-go/v82"

	"github.com/idemd/idemd/examples/rocketrides/api"
	"github.com/idemd/idemd/examples/rocketrides/receipts"
	"github.com/idemd/idemd/idem"
)

// --- idempotency keys and recovery (the article's spec) ---

func TestNewKeySucceeds(t *testing.T) {
	f := newFixture(t)
	key := newKey()
	rc := assertCreated(t, f.post(key, validParams))

	k := f.key(f.userID, key)
	if k.RecoveryPoint != "finished" || k.Locked || *k.Code != 201 {
		t.Fatalf("key %+v", k)
	}
	var chargeID, origin string
	if err := f.pool.QueryRow(context.Background(), `SELECT stripe_charge_id, origin_ip::text FROM rides r
		JOIN audit_records a ON a.resource_id = r.id AND a.resource_type = 'ride' AND a.action = 'ride.created'
		WHERE r.id = $1 AND r.idempotency_key_id = $2`, rc.RideID, k.ID).Scan(&chargeID, &origin); err != nil {
		t.Fatal(err)
	}
	charges := f.stripe.Charges()
	if len(charges) != 1 || charges[0].ID != chargeID || charges[0].Amount != api.RideAmount || charges[0].Customer != "cus_user" {
		t.Fatalf("charges %+v, ride charge %s", charges, chargeID)
	}
	// Stripe saw the key row's random upstream key, not a sequence id.
	if charges[0].IdempotencyKey != k.Upstream || len(k.Upstream) != 36 {
		t.Fatalf("upstream key %q, Stripe saw %q", k.Upstream, charges[0].IdempotencyKey)
	}
	if n := f.count(`SELECT count(*) FROM staged_jobs WHERE job_name = $1 AND (job_args->>'ride_id')::bigint = $2
		AND (job_args->>'user_id')::bigint = $3 AND (job_args->>'amount')::int = 2000`, receipts.Kind, rc.RideID, f.userID); n != 1 {
		t.Fatalf("%d staged receipt jobs", n)
	}
}

func TestReturnsStoredResultByteForByte(t *testing.T) {
	f := newFixture(t)
	key := newKey()
	first := f.post(key, validParams)
	assertCreated(t, first)
	again := f.post(key, validParams)
	if again.Status != 201 || string(again.Body) != string(first.Body) || !again.Replay || first.Replay {
		t.Fatalf("replay %d %q (replayed=%v), first %q", again.Status, again.Body, again.Replay, first.Body)
	}
	if f.stripe.ChargeCount() != 1 || f.rides() != 1 {
		t.Fatal("replay had side effects")
	}

	// A stored response, whatever it is (a 500 included), is replayed as is.
	stored := "{\"error\" : \"stored\",\n \"b\":1,\"a\":2}"
	key2 := newKey()
	if _, err := f.pool.Exec(context.Background(), `INSERT INTO idempotency_keys (idempotency_key, user_id, locked_at,
		request_method, request_path, request_params, recovery_point, response_code, response_body)
		VALUES ($1, $2, NULL, 'POST', '/rides', $3, 'finished', 500, $4)`,
		key2, f.userID, `{"origin_lat":0,"origin_lon":0,"target_lat":37.7749,"target_lon":-122.4194}`, stored); err != nil {
		t.Fatal(err)
	}
	r := f.post(key2, validParams)
	if r.Status != 500 || string(r.Body) != stored {
		t.Fatalf("got %d %q", r.Status, r.Body)
	}
}

func TestJSONAndFormBodiesAreTheSameRequest(t *testing.T) {
	f := newFixture(t)
	key := newKey()
	first := f.post(key, validParams)
	assertCreated(t, first)
	// Same values as JSON numbers, keys reordered: same fingerprint.
	r := f.do(key, "application/json", `{"target_lon":-122.4194,"target_lat":37.77490,"origin_lon":0,"origin_lat":-0.0}`)
	if r.Status != 201 || !r.Replay || string(r.Body) != string(first.Body) {
		t.Fatalf("JSON replay of a form request: %d %s", r.Status, r.Body)
	}
}

func TestPassesForUnlockedAndStaleKeys(t *testing.T) {
	f := newFixture(t)
	for _, lockedAt := range []string{"NULL", "now() - interval '91 seconds'"} {
		key := newKey()
		if _, err := f.pool.Exec(context.Background(), `INSERT INTO idempotency_keys (idempotency_key, user_id, locked_at,
			request_method, request_path, request_params, recovery_point)
			VALUES ($1, $2, `+lockedAt+`, 'POST', '/rides', $3, 'started')`,
			key, f.userID, `{"origin_lat": 0.0, "origin_lon": 0.0, "target_lat": 37.7749, "target_lon": -122.4194}`); err != nil {
			t.Fatal(err)
		}
		assertCreated(t, f.post(key, validParams))
	}
}

func TestInProgressIs409(t *testing.T) {
	f := newFixture(t)
	key := newKey()
	f.setFaults(api.FaultRule{At: api.RecoveryPointRideCreated, Rate: 1})
	if r := f.post(key, validParams); r.Status != 500 {
		t.Fatalf("fault: %d", r.Status)
	}
	f.setFaults()
	// Another process holds the lock (just taken).
	if _, err := f.pool.Exec(context.Background(), `UPDATE idempotency_keys SET locked_at = now()`); err != nil {
		t.Fatal(err)
	}
	r := f.post(key, validParams)
	if r.Status != 409 || r.errorMsg(t) != idem.MsgInProgress {
		t.Fatalf("got %d %s", r.Status, r.Body)
	}
}

func TestCardDeclineStoredAsFinal402(t *testing.T) {
	f := newFixture(t)
	key := newKey()
	r := f.post(key, validParams, withAuth("Bearer "+decliner))
	if r.Status != 402 || r.errorMsg(t) != "Error from payment processor: Your card was declined." {
		t.Fatalf("got %d %s", r.Status, r.Body)
	}
	k := f.key(f.declinID, key)
	if k.RecoveryPoint != "finished" || k.Locked || *k.Code != 402 {
		t.Fatalf("key %+v", k)
	}
	again := f.post(key, validParams, withAuth("Bearer "+decliner))
	if again.Status != 402 || string(again.Body) != string(r.Body) || f.stripe.ChargeCount() != 1 {
		t.Fatalf("replay %d %s, %d charges", again.Status, again.Body, f.stripe.ChargeCount())
	}
	if f.count(`SELECT count(*) FROM staged_jobs`) != 0 {
		t.Fatal("receipt staged for a declined ride")
	}
}

func TestStripeOutageIs503AndRetryable(t *testing.T) {
	f := newFixture(t)
	key := newKey()
	f.stripe.SetOutage(true)
	r := f.post(key, validParams)
	if r.Status != 503 {
		t.Fatalf("got %d %s", r.Status, r.Body)
	}
	k := f.key(f.userID, key)
	if k.RecoveryPoint != api.RecoveryPointRideCreated || k.Locked || k.Code != nil {
		t.Fatalf("outage must leave the key unlocked at ride_created: %+v", k)
	}
	f.stripe.SetOutage(false)
	assertCreated(t, f.post(key, validParams))
	if f.stripe.ChargeCount() != 1 || f.rides() != 1 {
		t.Fatalf("%d charges, %d rides", f.stripe.ChargeCount(), f.rides())
	}
}

// --- atomic phases and recovery points ---

func TestRecoversFromEachRecoveryPoint(t *testing.T) {
	for _, point := range []string{api.RecoveryPointStarted, api.RecoveryPointRideCreated, api.RecoveryPointChargeCreated} {
		t.Run(point, func(t *testing.T) {
			f := newFixture(t)
			key := newKey()
			// The request dies right after reaching the point.
			f.setFaults(api.FaultRule{At: point, Rate: 1})
			r := f.post(key, validParams)
			if r.Status != 500 || r.errorMsg(t) != idem.MsgInternal {
				t.Fatalf("fault: %d %s", r.Status, r.Body)
			}
			k := f.key(f.userID, key)
			if k.RecoveryPoint != point || k.Locked {
				t.Fatalf("after fault: %+v", k)
			}
			f.setFaults()
			rc := assertCreated(t, f.post(key, validParams))
			if f.rides() != 1 || f.stripe.ChargeCount() != 1 || f.count(`SELECT count(*) FROM staged_jobs`) != 1 {
				t.Fatalf("%d rides, %d charges, %d jobs", f.rides(), f.stripe.ChargeCount(), f.count(`SELECT count(*) FROM staged_jobs`))
			}
			if f.count(`SELECT count(*) FROM rides WHERE id = $1 AND stripe_charge_id = $2`, rc.RideID, f.stripe.Charges()[0].ID) != 1 {
				t.Fatal("ride not linked to the charge")
			}
		})
	}
}

// TestCrashAfterChargeBeforeCommit: Stripe charged, but the phase never
// committed (the process died). The retry charges again with the same
// upstream key, and Stripe returns the same charge.
func TestCrashAfterChargeBeforeCommit(t *testing.T) {
	f := newFixture(t)
	key := newKey()
	f.setFaults(api.FaultRule{At: api.RecoveryPointRideCreated, Rate: 1})
	f.post(key, validParams)
	f.setFaults()
	k := f.key(f.userID, key)

	var rideID int64
	if err := f.pool.QueryRow(context.Background(), `SELECT id FROM rides`).Scan(&rideID); err != nil {
		t.Fatal(err)
	}
	// The charge the dead process made, exactly as the API would make it.
	sc := stripe.NewClient("sk_test_fake", stripe.WithBackends(stripe.NewBackendsWithConfig(&stripe.BackendConfig{
		URL: stripe.String(f.stripeURL(t)), MaxNetworkRetries: stripe.Int64(0), LeveledLogger: &stripe.LeveledLogger{},
	})))
	p := &stripe.ChargeCreateParams{Amount: stripe.Int64(2000), Currency: stripe.String("usd"),
		Customer: stripe.String("cus_user"), Description: stripe.String("Charge for ride " + itoa(rideID))}
	p.SetIdempotencyKey(k.Upstream)
	first, err := sc.V1Charges.Create(context.Background(), p)
	if err != nil {
		t.Fatal(err)
	}
	assertCreated(t, f.post(key, validParams))
	if f.stripe.ChargeCount() != 1 {
		t.Fatalf("%d charges", f.stripe.ChargeCount())
	}
	if f.count(`SELECT count(*) FROM rides WHERE stripe_charge_id = $1`, first.ID) != 1 {
		t.Fatal("ride does not carry the first charge")
	}
}

func TestSerializationConflictIs409AndUnlocks(t *testing.T) {
	f := newFixture(t)
	key := newKey()
	f.setFaults(api.FaultRule{At: api.RecoveryPointRideCreated, Rate: 1, Kind: api.FaultSerialization})
	r := f.post(key, validParams)
	if r.Status != 409 || r.errorMsg(t) != idem.MsgConflict {
		t.Fatalf("got %d %s", r.Status, r.Body)
	}
	if k := f.key(f.userID, key); k.Locked || k.RecoveryPoint != api.RecoveryPointRideCreated {
		t.Fatalf("key %+v", k)
	}
	// Retried internally before giving up: the fault fired more than once.
	if f.faults.Fired() < 2 {
		t.Fatalf("fault fired %d times; no internal retry", f.faults.Fired())
	}
	f.setFaults()
	assertCreated(t, f.post(key, validParams))
}

// --- failures ---

func TestAuthErrors(t *testing.T) {
	f := newFixture(t)
	cases := []struct {
		auth, msg string
	}{
		{"", "Please specify credentials in the Authorization header."},
		{"Bearer bad-key", "Credentials in Authorization were invalid."},
		{"user@example.com", "Credentials in Authorization were invalid."},
		{"Bearer ", "Credentials in Authorization were invalid."},
	}
	for _, c := range cases {
		r := f.post(newKey(), validParams, func(r *http.Request) {
			if c.auth == "" {
				r.Header.Del("Authorization")
			} else {
				r.Header.Set("Authorization", c.auth)
			}
		})
		if r.Status != 401 || r.errorMsg(t) != c.msg {
			t.Errorf("auth %q: %d %s", c.auth, r.Status, r.Body)
		}
	}
	if f.count(`SELECT count(*) FROM idempotency_keys`) != 0 {
		t.Fatal("unauthenticated request created a key")
	}
}

func TestValidationErrors(t *testing.T) {
	f := newFixture(t)
	with := func(k, v string) url.Values {
		p := url.Values{}
		for kk, vv := range validParams {
			p[kk] = vv
		}
		if v == "" {
			p.Del(k)
		} else {
			p.Set(k, v)
		}
		return p
	}
	cases := []struct {
		name   string
		key    string
		params url.Values
		status int
		msg    string
	}{
		{"missing key", "", validParams, 400, idem.MsgKeyMissing},
		{"key too short", "xxx", validParams, 400, idem.MsgKeyTooShort(api.MinKeyLength)},
		{"key too long", strings.Repeat("k", 256), validParams, 400, idem.MsgKeyTooLong(idem.MaxKeyLength)},
		{"missing params", newKey(), url.Values{}, 422, "Please specify parameter 'origin_lat'."},
		{"missing one", newKey(), with("target_lon", ""), 422, "Please specify parameter 'target_lon'."},
		{"not a float", newKey(), with("origin_lon", "abc"), 422, "Parameter 'origin_lon' must be a floating-point number."},
		{"bad latitude", newKey(), with("target_lat", "90.5"), 422, "Parameter 'target_lat' must be a valid latitude coordinate."},
		{"bad longitude", newKey(), with("origin_lon", "-180.1"), 422, "Parameter 'origin_lon' must be a valid longitude coordinate."},
		{"NaN", newKey(), with("origin_lat", "NaN"), 422, "Parameter 'origin_lat' must be a valid latitude coordinate."},
	}
	for _, c := range cases {
		r := f.post(c.key, c.params)
		if r.Status != c.status || r.errorMsg(t) != c.msg {
			t.Errorf("%s: %d %s", c.name, r.Status, r.Body)
		}
	}
	if r := f.do(newKey(), "application/json", `[1,2]`); r.Status != 400 {
		t.Errorf("JSON array body: %d", r.Status)
	}
	if f.count(`SELECT count(*) FROM idempotency_keys`) != 0 {
		t.Fatal("invalid request created a key")
	}
}

func TestParamsMismatchIs422(t *testing.T) {
	f := newFixture(t)
	key := newKey()
	assertCreated(t, f.post(key, validParams))
	p := url.Values{}
	for k, v := range validParams {
		p[k] = v
	}
	p.Set("origin_lat", "10.0")
	r := f.post(key, p)
	if r.Status != 422 || r.errorMsg(t) != idem.MsgParamsMismatch {
		t.Fatalf("got %d %s", r.Status, r.Body)
	}
}

// --- the completer's replay path through the API ---

func TestReplayPathFinishesAbandonedKey(t *testing.T) {
	f := newFixture(t)
	key := newKey()
	f.setFaults(api.FaultRule{At: api.RecoveryPointRideCreated, Rate: 1})
	f.post(key, validParams) // form-encoded original, abandoned at ride_created
	f.setFaults()
	k := f.key(f.userID, key)

	r := f.replay(k, f.userID) // JSON body from the stored params
	assertCreated(t, r)
	if k2 := f.key(f.userID, key); k2.RecoveryPoint != "finished" {
		t.Fatalf("key %+v", k2)
	}
	if f.stripe.ChargeCount() != 1 || f.stripe.Charges()[0].Customer != "cus_user" {
		t.Fatal("replay did not charge as the key's user")
	}
	// The client's own retry now gets the stored response.
	again := f.post(key, validParams)
	if again.Status != 201 || string(again.Body) != string(r.Body) {
		t.Fatalf("client retry %d %s", again.Status, again.Body)
	}
}

func TestReplayPathRejections(t *testing.T) {
	f := newFixture(t)
	open, done := newKey(), newKey()
	f.setFaults(api.FaultRule{At: api.RecoveryPointRideCreated, Rate: 1})
	f.post(open, validParams)
	f.setFaults()
	assertCreated(t, f.post(done, validParams))
	ko, kd := f.key(f.userID, open), f.key(f.userID, done)

	if r := f.replay(kd, f.userID); r.Status != 401 {
		t.Errorf("finished key: %d", r.Status)
	}
	if r := f.replay(ko, f.otherID); r.Status != 401 {
		t.Errorf("other user's key: %d", r.Status)
	}
	unknown := ko
	unknown.ID = -1
	if _, err := f.pool.Exec(context.Background(), `INSERT INTO idempotency_keys (id, idempotency_key, user_id, locked_at,
		request_method, request_path, request_params, recovery_point) VALUES (-1, 'placeholder-key-123456', 999, NULL, 'POST', '/rides', '{}', 'started')`); err != nil {
		t.Fatal(err)
	}
	if r := f.replay(unknown, f.userID); r.Status != 401 {
		t.Errorf("key unknown for this user: %d", r.Status)
	}
	// Forged: a signature by another secret.
	r := f.do(open, "application/json", ko.Params, func(r *http.Request) {
		r.Header.Del("Authorization")
		r.Header.Set("Idemd-Replay-Signature", "t=1767225600,n=abcd,u="+itoa(f.userID)+",v1="+strings.Repeat("ab", 32))
	})
	if r.Status != 401 {
		t.Errorf("forged: %d", r.Status)
	}
	if f.stripe.ChargeCount() != 1 {
		t.Fatalf("rejected replays charged: %d charges", f.stripe.ChargeCount())
	}
}

// --- concurrency ---

func TestFiftyParallelIdenticalRequests(t *testing.T) {
	f := newFixture(t)
	key := newKey()
	const n = 50
	start := make(chan struct{})
	var wg sync.WaitGroup
	results := make([]response, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			results[i] = f.post(key, validParams)
		}()
	}
	close(start)
	wg.Wait()
	created := 0
	for _, r := range results {
		switch r.Status {
		case 201:
			created++
		case 409:
		default:
			t.Errorf("unexpected %d %s", r.Status, r.Body)
		}
	}
	if created == 0 {
		t.Fatal("no request succeeded")
	}
	// Whoever did not finish it can now retry and get the stored result.
	assertCreated(t, f.post(key, validParams))
	if f.rides() != 1 || f.stripe.ChargeCount() != 1 || f.count(`SELECT count(*) FROM staged_jobs`) != 1 ||
		f.count(`SELECT count(*) FROM audit_records`) != 1 {
		t.Fatalf("%d rides, %d charges, %d jobs", f.rides(), f.stripe.ChargeCount(), f.count(`SELECT count(*) FROM staged_jobs`))
	}
}
