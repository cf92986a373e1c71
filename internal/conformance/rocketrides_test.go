package conformance_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/idemd/idemd/examples/rocketrides/api"
	"github.com/idemd/idemd/examples/rocketrides/fakestripe"
	"github.com/idemd/idemd/idem/replayauth"
	"github.com/idemd/idemd/internal/conformance"
	"github.com/idemd/idemd/internal/testing/dbtest"
)

// TestRocketRidesPasses: the reference API passes every scenario, with
// the database and the replay secret, so none is skipped.
func TestRocketRidesPasses(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := dbtest.NewPool(t)
	if err := api.Migrate(ctx, dbtest.MigratorPool(t, pool)); err != nil {
		t.Fatal(err)
	}
	for email, key := range map[string]string{"rider@example.com": "sk_test_rider_0123456789", "other@example.com": "sk_test_other_0123456789"} {
		if _, err := api.CreateUser(ctx, pool, email, "cus_"+email, key); err != nil {
			t.Fatal(err)
		}
	}
	stripe := httptest.NewServer(fakestripe.New())
	t.Cleanup(stripe.Close)
	secret, err := replayauth.NewSecret([]byte(testSecret))
	if err != nil {
		t.Fatal(err)
	}
	verifier, err := replayauth.NewVerifier(0, secret)
	if err != nil {
		t.Fatal(err)
	}
	stripeHTTP := &http.Client{Transport: &http.Transport{}}
	t.Cleanup(stripeHTTP.CloseIdleConnections)
	h, err := api.New(api.Config{Pool: pool, StripeURL: stripe.URL, StripeKey: "sk_test_fake", Replay: verifier,
		Faults: api.NewFaults(), StripeHTTPClient: stripeHTTP})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)

	rep, err := conformance.Run(ctx, conformance.Config{
		APIURL: srv.URL, Pool: pool, Secrets: []replayauth.Secret{secret},
		Template: conformance.Template{
			Method: "POST", Path: "/rides",
			Headers:    map[string]string{"Authorization": "Bearer sk_test_rider_0123456789"},
			Body:       json.RawMessage(`{"origin_lat": 0.0, "origin_lon": 0.0, "target_lat": 37.7749, "target_lon": -122.4194}`),
			SecondUser: &conformance.User{Headers: map[string]string{"Authorization": "Bearer sk_test_other_0123456789"}},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	logReport(t, rep)
	if rep.Failed != 0 || rep.Skipped != 0 {
		t.Fatalf("failed %v, skipped %d", rep.FailedNames(), rep.Skipped)
	}
	assertNoKeysLeft(t, pool)
}
