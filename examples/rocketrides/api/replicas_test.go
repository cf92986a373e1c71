package api_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemd/idemd/examples/rocketrides/api"
	"github.com/idemd/idemd/idem/replayauth"
)

// Two replicas of Rocket Rides on one database, each with its own pool and
// its own verifier: a signed replay that the first accepted (and then
// failed, leaving the key unfinished) is refused by the second, where a
// per-process nonce memory accepted it (issue 16, part 3). A fresh
// signature then finishes the key on the second replica, charging once.
func TestReplayNonceRefusedBySecondReplica(t *testing.T) {
	f := newFixture(t)
	pool2, err := pgxpool.New(context.Background(), f.pool.Config().ConnString())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool2.Close)
	secret, err := replayauth.NewSecret([]byte(replaySeed))
	if err != nil {
		t.Fatal(err)
	}
	verifier2, err := replayauth.NewVerifier(0, secret)
	if err != nil {
		t.Fatal(err)
	}
	h2, err := api.New(api.Config{Pool: pool2, StripeURL: f.stripeBase, StripeKey: "sk_test_fake", Replay: verifier2})
	if err != nil {
		t.Fatal(err)
	}
	replica2 := httptest.NewServer(h2)
	t.Cleanup(replica2.Close)

	key := newKey()
	f.setFaults(api.FaultRule{At: api.RecoveryPointStarted, Rate: 1})
	f.post(key, validParams) // abandoned at started, before any charge
	k := f.key(f.userID, key)
	if k.RecoveryPoint != api.RecoveryPointStarted {
		t.Fatalf("key %+v, want it abandoned at started", k)
	}
	body := k.Params
	sig, err := f.signer.Sign(replayauth.Request{Method: k.Method, Path: k.Path, UserID: f.userID, IdempotencyKey: key, Body: []byte(body)})
	if err != nil {
		t.Fatal(err)
	}
	send := func(srv *httptest.Server, sig string) int {
		t.Helper()
		r, err := http.NewRequest(k.Method, srv.URL+k.Path, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		r.Header.Set("Content-Type", "application/json")
		r.Header.Set(replayauth.IdempotencyKeyHeader, key)
		r.Header.Set(replayauth.Header, sig)
		resp, err := srv.Client().Do(r)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		_, _ = io.Copy(io.Discard, resp.Body)
		return resp.StatusCode
	}

	// Replica 1 accepts the signature, then fails before any work.
	f.setFaults(api.FaultRule{At: api.AtBefore, Rate: 1})
	if code := send(f.srv, sig); code != http.StatusInternalServerError {
		t.Fatalf("replica 1: %d, want the injected 500", code)
	}
	// The same signature on replica 2: refused, nothing charged.
	if code := send(replica2, sig); code != http.StatusUnauthorized {
		t.Fatalf("replica 2, same signature: %d, want 401", code)
	}
	if n := f.stripe.ChargeCount(); n != 0 {
		t.Fatalf("%d charges after the refused replay, want 0", n)
	}
	if n := f.count(`SELECT count(*) FROM idemd_replay_nonces`); n != 1 {
		t.Fatalf("%d rows in idemd_replay_nonces, want 1", n)
	}
	// A fresh signature finishes the key there.
	sig2, err := f.signer.Sign(replayauth.Request{Method: k.Method, Path: k.Path, UserID: f.userID, IdempotencyKey: key, Body: []byte(body)})
	if err != nil {
		t.Fatal(err)
	}
	if code := send(replica2, sig2); code != http.StatusCreated {
		t.Fatalf("replica 2, fresh signature: %d, want 201", code)
	}
	if k := f.key(f.userID, key); k.RecoveryPoint != "finished" || f.stripe.ChargeCount() != 1 {
		t.Fatalf("key %+v, %d charges; want finished with one charge", k, f.stripe.ChargeCount())
	}
}
