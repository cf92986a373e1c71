package simulator_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/idemd/idemd/examples/rocketrides/api"
	"github.com/idemd/idemd/examples/rocketrides/fakestripe"
	"github.com/idemd/idemd/examples/rocketrides/simulator"
	"github.com/idemd/idemd/internal/testing/dbtest"
)

func TestMain(m *testing.M) { dbtest.Main(m) }

// TestSimulatorWithGiveUps runs real traffic with clients that walk away
// mid-request and checks the invariants that must hold whatever the timing:
// every ride accounted for, no key charged twice, every ride's charge real.
func TestSimulatorWithGiveUps(t *testing.T) {
	ctx := context.Background()
	pool := dbtest.NewPool(t)
	// Rocket Rides' tables as the migrator (the application's migration
	// in production), so roles.sql's default privileges grant them to the
	// runtime role the test's pool uses.
	if err := api.Migrate(ctx, dbtest.MigratorPool(t, pool)); err != nil {
		t.Fatal(err)
	}
	fake := fakestripe.New()
	fake.SetLatency(2 * time.Millisecond)
	stripeSrv := httptest.NewServer(fake)
	defer stripeSrv.Close()
	stripeHTTP := &http.Client{Transport: &http.Transport{}}
	defer stripeHTTP.CloseIdleConnections()
	h, err := api.New(api.Config{Pool: pool, StripeURL: stripeSrv.URL, StripeKey: "sk_test", StripeHTTPClient: stripeHTTP,
		Faults: api.NewFaults(api.FaultRule{At: api.RecoveryPointRideCreated, Rate: 0.1})})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	defer srv.Close()
	for i, c := range []string{"cus_ok", fakestripe.DeclinePrefix + "_x"} {
		if _, err := api.CreateUser(ctx, pool, "sim"+string(rune('a'+i))+"@example.com", c, "sk_sim_key_"+c); err != nil {
			t.Fatal(err)
		}
	}
	httpClient := &http.Client{Transport: &http.Transport{}}
	defer httpClient.CloseIdleConnections()
	stats, err := simulator.Run(ctx, simulator.Config{
		BaseURL: srv.URL, APIKeys: []string{"sk_sim_key_cus_ok", "sk_sim_key_" + fakestripe.DeclinePrefix + "_x"},
		Concurrency: 4, Rides: 40, Duration: time.Minute, GiveUpRate: 0.3, GiveUpAfter: 5 * time.Millisecond,
		HTTPClient: httpClient,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Log(stats)
	if stats.Rides != 40 || stats.Created+stats.Declined+stats.GaveUp+stats.Abandoned+stats.Rejected != stats.Rides || stats.Rejected != 0 {
		t.Fatalf("accounting: %s", stats)
	}
	// Rides linked first, charges second: a handler whose client gave up
	// may still be running, and a charge is recorded before its ride's
	// link commits, so read the other way a late one could link a ride
	// to a charge the snapshot missed.
	var linked, finished201 int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM rides WHERE stripe_charge_id IS NOT NULL`).Scan(&linked); err != nil {
		t.Fatal(err)
	}
	charges := fake.Charges()
	perKey := map[string]int{}
	for _, c := range charges {
		perKey[c.IdempotencyKey]++
		if perKey[c.IdempotencyKey] > 1 || c.IdempotencyKey == "" {
			t.Fatalf("upstream key %q charged twice", c.IdempotencyKey)
		}
	}
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM idempotency_keys WHERE response_code = 201`).Scan(&finished201); err != nil {
		t.Fatal(err)
	}
	if linked > len(charges) || int64(finished201) < stats.Created {
		t.Fatalf("%d rides linked to charges, %d charges; %d finished 201 < %d created", linked, len(charges), finished201, stats.Created)
	}
}
