package conformance_test

import (
	"context"
	"encoding/json"
	"net/http/httptest"
	"slices"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemd/idemd/idem/replayauth"
	"github.com/idemd/idemd/internal/conformance"
	"github.com/idemd/idemd/internal/testing/dbtest"
)

const testSecret = "0123456789abcdef0123456789abcdef"

// orderTemplate is the --request of orderAPI.
func orderTemplate() conformance.Template {
	return conformance.Template{
		Method: "POST", Path: "/orders",
		Headers:    map[string]string{"Authorization": "Bearer user-7"},
		Body:       json.RawMessage(`{"sku":"book","quantity":2}`),
		SecondUser: &conformance.User{Headers: map[string]string{"Authorization": "Bearer user-8"}},
	}
}

// ordersDB is a migrated database with orderAPI's table.
func ordersDB(t *testing.T) *pgxpool.Pool {
	t.Helper()
	pool := dbtest.NewPool(t)
	if _, err := dbtest.MigratorPool(t, pool).Exec(context.Background(), ordersTable); err != nil {
		t.Fatal(err)
	}
	return pool
}

// runOrders runs every scenario against orderAPI with b.
func runOrders(t *testing.T, pool *pgxpool.Pool, b breaks) conformance.Report {
	t.Helper()
	return runOrdersWith(t, pool, b, true)
}

// runOrdersWith is runOrders, with the database and the secret given to
// the run or not.
func runOrdersWith(t *testing.T, pool *pgxpool.Pool, b breaks, withDB bool) conformance.Report {
	t.Helper()
	h, err := newOrderAPI(pool, []byte(testSecret), b)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	secret, err := replayauth.NewSecret([]byte(testSecret))
	if err != nil {
		t.Fatal(err)
	}
	cfg := conformance.Config{APIURL: srv.URL, Template: orderTemplate()}
	if withDB {
		cfg.Pool, cfg.Secrets = pool, []replayauth.Secret{secret}
	}
	rep, err := conformance.Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	return rep
}

func logReport(t *testing.T, rep conformance.Report) {
	t.Helper()
	for _, r := range rep.Results {
		t.Logf("%-4s %-20s %s", r.Outcome, r.Name, r.Why)
	}
}

// TestOrderAPIPasses: the API on idem, unbroken, passes every scenario;
// none is skipped.
func TestOrderAPIPasses(t *testing.T) {
	t.Parallel()
	rep := runOrders(t, ordersDB(t), breaks{})
	logReport(t, rep)
	if rep.Failed != 0 || rep.Skipped != 0 || rep.Passed != len(conformance.Scenarios()) {
		t.Fatalf("passed %d, failed %v, skipped %d of %d", rep.Passed, rep.FailedNames(), rep.Skipped, len(conformance.Scenarios()))
	}
}

// TestBrokenAPIsFailTheirScenario: each way of breaking the protocol
// fails exactly the scenarios that check it, and no other.
func TestBrokenAPIsFailTheirScenario(t *testing.T) {
	t.Parallel()
	pool := ordersDB(t)
	cases := []struct {
		name string
		b    breaks
		want []string
	}{
		{"replays another body", breaks{ReplayOtherBody: true}, []string{"replay"}},
		{"runs a held key", breaks{RunTwice: true}, []string{"concurrent"}},
		{"accepts a missing key", breaks{AcceptNoKey: true}, []string{"key-required"}},
		{"runs other parameters under a used key", breaks{MismatchRuns: true}, []string{"params-mismatch"}},
		{"keys not per user", breaks{KeysGlobal: true}, []string{"per-user"}},
		{"stages on every request", breaks{StageEveryRequest: true}, []string{"staged-jobs"}},
		{"leaves finished keys locked", breaks{LeaveLocked: true}, []string{"stored-response"}},
		// An API that cannot resume a key cannot be finished by the
		// completer either.
		{"never resumes a key", breaks{NoResume: true}, []string{"abandoned-resume", "replay-signed"}},
		{"never takes over a crashed request's lock", breaks{NoTakeover: true}, []string{"abandoned-resume"}},
		// Without the HMAC nothing ties the body to the signature.
		{"skips the HMAC", breaks{NoHMAC: true}, []string{"replay-forged", "replay-tampered"}},
		{"signs over the stored params", breaks{HMACOverStored: true}, []string{"replay-tampered"}},
		{"ignores the timestamp", breaks{NoWindow: true}, []string{"replay-expired"}},
		{"ignores the signed user", breaks{NoUserCheck: true}, []string{"replay-foreign-user"}},
		{"forgets nonces", breaks{NoNonce: true}, []string{"replay-nonce"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			rep := runOrders(t, pool, c.b)
			if got := rep.FailedNames(); !slices.Equal(got, c.want) {
				logReport(t, rep)
				t.Fatalf("failed %v, want exactly %v", got, c.want)
			}
			if rep.OK() {
				t.Fatal("report OK with failures")
			}
		})
	}
}

// TestIgnoredKeyFailsReplayFirst: an API that ignores Idempotency-Key
// altogether is told so by the replay scenario, first.
func TestIgnoredKeyFailsReplayFirst(t *testing.T) {
	t.Parallel()
	rep := runOrders(t, ordersDB(t), breaks{IgnoreKey: true})
	logReport(t, rep)
	got := rep.FailedNames()
	if len(got) == 0 || got[0] != "replay" {
		t.Fatalf("failed %v, want replay first", got)
	}
	want := []string{"replay", "stored-response", "params-mismatch", "key-required", "concurrent", "per-user", "staged-jobs",
		"abandoned-resume", "replay-signed", "replay-forged", "replay-tampered", "replay-expired", "replay-foreign-user", "replay-nonce"}
	if !slices.Equal(got, want) {
		t.Fatalf("failed %v, want %v", got, want)
	}
}

// TestBrokenAPIsWithoutDatabase: what a client alone can see is enough
// to catch these, from the answers only.
func TestBrokenAPIsWithoutDatabase(t *testing.T) {
	t.Parallel()
	pool := ordersDB(t)
	cases := []struct {
		name string
		b    breaks
		want []string
	}{
		{"ignores the key", breaks{IgnoreKey: true}, []string{"replay", "params-mismatch", "key-required", "concurrent"}},
		{"replays another body", breaks{ReplayOtherBody: true}, []string{"replay"}},
		{"accepts a missing key", breaks{AcceptNoKey: true}, []string{"key-required"}},
		{"runs other parameters under a used key", breaks{MismatchRuns: true}, []string{"params-mismatch"}},
		{"keys not per user", breaks{KeysGlobal: true}, []string{"per-user"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			rep := runOrdersWith(t, pool, c.b, false)
			if got := rep.FailedNames(); !slices.Equal(got, c.want) {
				logReport(t, rep)
				t.Fatalf("failed %v, want exactly %v", got, c.want)
			}
		})
	}
}
