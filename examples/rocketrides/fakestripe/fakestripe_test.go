package fakestripe_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/stripe/stripe-go/v82"

	"github.com/idemd/idemd/examples/rocketrides/fakestripe"
)

func client(t *testing.T, fake *fakestripe.Server) *stripe.Client {
	t.Helper()
	srv := httptest.NewServer(fake)
	t.Cleanup(srv.Close)
	hc := &http.Client{Transport: &http.Transport{}}
	t.Cleanup(hc.CloseIdleConnections)
	b := stripe.GetBackendWithConfig(stripe.APIBackend, &stripe.BackendConfig{
		URL: stripe.String(srv.URL), HTTPClient: hc, MaxNetworkRetries: stripe.Int64(0),
		LeveledLogger: &stripe.LeveledLogger{Level: stripe.LevelNull},
	})
	return stripe.NewClient("sk_test_x", stripe.WithBackends(&stripe.Backends{API: b, Connect: b, Uploads: b, MeterEvents: b}))
}

func params(amount int64, customer, key string) *stripe.ChargeCreateParams {
	p := &stripe.ChargeCreateParams{Amount: stripe.Int64(amount), Currency: stripe.String("usd"), Customer: stripe.String(customer)}
	if key != "" {
		p.SetIdempotencyKey(key)
	}
	return p
}

func TestIdempotencyKeySemantics(t *testing.T) {
	fake := fakestripe.New()
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	fake.SetClock(func() time.Time { return now })
	sc := client(t, fake)
	ctx := context.Background()

	c1, err := sc.V1Charges.Create(ctx, params(2000, "cus_1", "k1"))
	if err != nil {
		t.Fatal(err)
	}
	c2, err := sc.V1Charges.Create(ctx, params(2000, "cus_1", "k1"))
	if err != nil || c2.ID != c1.ID || c1.Amount != 2000 {
		t.Fatalf("same key and params: %v %v %v", c1.ID, c2, err)
	}
	if fake.ChargeCount() != 1 || fake.Stats().Replays != 1 {
		t.Fatalf("stats %+v", fake.Stats())
	}
	_, err = sc.V1Charges.Create(ctx, params(2001, "cus_1", "k1"))
	var se *stripe.Error
	if !errors.As(err, &se) || se.Type != stripe.ErrorTypeIdempotency || se.HTTPStatusCode != 400 {
		t.Fatalf("different params: %v", err)
	}
	// Within 24 h still remembered; after, forgotten.
	now = now.Add(fakestripe.KeyRetention - time.Second)
	if c, _ := sc.V1Charges.Create(ctx, params(2000, "cus_1", "k1")); c.ID != c1.ID {
		t.Fatal("key forgotten early")
	}
	now = now.Add(2 * time.Second)
	c3, err := sc.V1Charges.Create(ctx, params(2000, "cus_1", "k1"))
	if err != nil || c3.ID == c1.ID || fake.ChargeCount() != 2 {
		t.Fatalf("expired key must charge again: %v %v", c3, err)
	}
	// No key: every request charges.
	if _, err := sc.V1Charges.Create(ctx, params(100, "cus_1", "")); err != nil {
		t.Fatal(err)
	}
	if fake.ChargeCount() != 3 {
		t.Fatalf("%d charges", fake.ChargeCount())
	}
	if got := fake.Charges()[0]; got.IdempotencyKey != "k1" || got.Customer != "cus_1" || got.Status != "succeeded" {
		t.Fatalf("record %+v", got)
	}
}

func TestDeclineIsStoredOutageIsNot(t *testing.T) {
	fake := fakestripe.New()
	sc := client(t, fake)
	ctx := context.Background()
	fake.DeclineCustomer("cus_x")
	for range 2 {
		_, err := sc.V1Charges.Create(ctx, params(2000, "cus_x", "kd"))
		var se *stripe.Error
		if !errors.As(err, &se) || se.Type != stripe.ErrorTypeCard || se.Msg != "Your card was declined." || se.HTTPStatusCode != 402 {
			t.Fatalf("decline: %v", err)
		}
	}
	if fake.ChargeCount() != 1 || fake.Charges()[0].Status != "failed" {
		t.Fatalf("declined charge recorded once: %+v", fake.Charges())
	}
	if _, err := sc.V1Charges.Create(ctx, params(2000, fakestripe.DeclinePrefix+"_9", "")); err == nil {
		t.Fatal("decline prefix not honoured")
	}

	fake.SetOutage(true)
	_, err := sc.V1Charges.Create(ctx, params(2000, "cus_ok", "ko"))
	var se *stripe.Error
	if !errors.As(err, &se) || se.Type != stripe.ErrorTypeAPI || se.HTTPStatusCode != 503 {
		t.Fatalf("outage: %v", err)
	}
	fake.SetOutage(false)
	if _, err := sc.V1Charges.Create(ctx, params(2000, "cus_ok", "ko")); err != nil {
		t.Fatalf("outage response must not be stored: %v", err)
	}
}

func TestConcurrentSameKeyOneCharge(t *testing.T) {
	fake := fakestripe.New()
	sc := client(t, fake)
	var wg sync.WaitGroup
	ids := make([]string, 20)
	for i := range ids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := sc.V1Charges.Create(context.Background(), params(2000, "cus_1", "same"))
			if err == nil {
				ids[i] = c.ID
			}
		}()
	}
	wg.Wait()
	for _, id := range ids {
		if id != ids[0] || id == "" {
			t.Fatalf("ids %v", ids)
		}
	}
	if fake.ChargeCount() != 1 {
		t.Fatalf("%d charges", fake.ChargeCount())
	}
}
