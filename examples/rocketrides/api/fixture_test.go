package api_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemd/idemd/examples/rocketrides/api"
	"github.com/idemd/idemd/examples/rocketrides/fakestripe"
	"github.com/idemd/idemd/idem/replayauth"
	"github.com/idemd/idemd/internal/testing/dbtest"
)

const (
	userKey    = "sk_test_user_0123456789"
	decliner   = "sk_test_decline_0123456789"
	otherKey   = "sk_test_other_0123456789"
	replaySeed = "0123456789abcdef0123456789abcdef"
)

type fixture struct {
	t        *testing.T
	pool     *pgxpool.Pool
	stripe   *fakestripe.Server
	faults   *api.Faults
	srv      *httptest.Server
	signer   *replayauth.Signer
	userID   int64
	otherID  int64
	declinID int64
	// stripeBase is the fake Stripe's URL.
	stripeBase string
}

func newFixture(t *testing.T) *fixture { t.Helper(); return newFixtureWith(t, nil) }

// newFixtureWith is newFixture with the API's configuration changed by
// configure.
func newFixtureWith(t *testing.T, configure func(*api.Config)) *fixture {
	t.Helper()
	ctx := context.Background()
	pool := dbtest.NewPool(t)
	// Rocket Rides' tables as the migrator (the application's migration
	// in production), so roles.sql's default privileges grant them to the
	// runtime role the test's pool uses.
	if err := api.Migrate(ctx, dbtest.MigratorPool(t, pool)); err != nil {
		t.Fatal(err)
	}
	f := &fixture{t: t, pool: pool, stripe: fakestripe.New(), faults: api.NewFaults()}
	stripeSrv := httptest.NewServer(f.stripe)
	t.Cleanup(stripeSrv.Close)
	f.stripeBase = stripeSrv.URL

	var err error
	if f.userID, err = api.CreateUser(ctx, pool, "user@example.com", "cus_user", userKey); err != nil {
		t.Fatal(err)
	}
	if f.otherID, err = api.CreateUser(ctx, pool, "other@example.com", "cus_other", otherKey); err != nil {
		t.Fatal(err)
	}
	if f.declinID, err = api.CreateUser(ctx, pool, "user-bad-source@example.com", fakestripe.DeclinePrefix+"_1", decliner); err != nil {
		t.Fatal(err)
	}

	secret, err := replayauth.NewSecret([]byte(replaySeed))
	if err != nil {
		t.Fatal(err)
	}
	verifier, err := replayauth.NewVerifier(0, secret)
	if err != nil {
		t.Fatal(err)
	}
	if f.signer, err = replayauth.NewSigner(secret); err != nil {
		t.Fatal(err)
	}
	stripeHTTP := &http.Client{Transport: &http.Transport{}}
	t.Cleanup(stripeHTTP.CloseIdleConnections)
	cfg := api.Config{
		Pool: pool, StripeURL: stripeSrv.URL, StripeKey: "sk_test_fake", Replay: verifier,
		Faults: f.faults, StripeHTTPClient: stripeHTTP,
	}
	if configure != nil {
		configure(&cfg)
	}
	h, err := api.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	f.srv = httptest.NewServer(h)
	t.Cleanup(f.srv.Close)
	return f
}

var validParams = url.Values{
	"origin_lat": {"0.0"}, "origin_lon": {"0.0"}, "target_lat": {"37.7749"}, "target_lon": {"-122.4194"},
}

func newKey() string { return "key-" + uuid.NewString() }

type response struct {
	Status  int
	Body    []byte
	Replay  bool
	Headers http.Header
}

func (r response) errorMsg(t *testing.T) string {
	t.Helper()
	var e struct {
		Error string `json:"error"`
	}
	if err := json.Unmarshal(r.Body, &e); err != nil || e.Error == "" {
		t.Fatalf("not an error body: %q", r.Body)
	}
	return e.Error
}

type reqOpt func(*http.Request)

func withAuth(v string) reqOpt { return func(r *http.Request) { r.Header.Set("Authorization", v) } }

func (f *fixture) do(key, contentType, body string, opts ...reqOpt) response {
	f.t.Helper()
	r, err := http.NewRequest(http.MethodPost, f.srv.URL+"/rides", strings.NewReader(body))
	if err != nil {
		f.t.Fatal(err)
	}
	r.Header.Set("Authorization", "Bearer "+userKey)
	if contentType != "" {
		r.Header.Set("Content-Type", contentType)
	}
	if key != "" {
		r.Header.Set("Idempotency-Key", key)
	}
	for _, o := range opts {
		o(r)
	}
	resp, err := f.srv.Client().Do(r)
	if err != nil {
		f.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		f.t.Fatal(err)
	}
	return response{Status: resp.StatusCode, Body: b, Replay: resp.Header.Get("Idempotent-Replayed") == "true", Headers: resp.Header}
}

// post sends the article's form-encoded request.
func (f *fixture) post(key string, params url.Values, opts ...reqOpt) response {
	f.t.Helper()
	return f.do(key, "application/x-www-form-urlencoded", params.Encode(), opts...)
}

type keyState struct {
	ID            int64
	RecoveryPoint string
	Locked        bool
	Code          *int
	Body          *string
	Upstream      string
	Method, Path  string
	Params        string
	UserID        int64
}

func (f *fixture) key(userID int64, key string) keyState {
	f.t.Helper()
	var k keyState
	err := f.pool.QueryRow(context.Background(), `SELECT id, recovery_point, locked_at IS NOT NULL, response_code,
		response_body, COALESCE(upstream_idempotency_key::text, ''), request_method, request_path, request_params::text, user_id
		FROM idempotency_keys WHERE user_id = $1 AND idempotency_key = $2`, userID, key).
		Scan(&k.ID, &k.RecoveryPoint, &k.Locked, &k.Code, &k.Body, &k.Upstream, &k.Method, &k.Path, &k.Params, &k.UserID)
	if err != nil {
		f.t.Fatalf("key %s: %v", key, err)
	}
	return k
}

func (f *fixture) count(sql string, args ...any) int {
	f.t.Helper()
	var n int
	if err := f.pool.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		f.t.Fatal(err)
	}
	return n
}

func (f *fixture) rides() int { return f.count(`SELECT count(*) FROM rides`) }

func (f *fixture) setFaults(rules ...api.FaultRule) {
	f.t.Helper()
	if err := f.faults.Set(rules...); err != nil {
		f.t.Fatal(err)
	}
}

// replay sends what idemd's completer sends for a stored key: its method and
// path, the stored params as a JSON body, the key and a signature.
func (f *fixture) replay(k keyState, signAs int64) response {
	f.t.Helper()
	body := []byte(k.Params)
	key := f.keyValue(k.ID)
	sig, err := f.signer.Sign(replayauth.Request{Method: k.Method, Path: k.Path, UserID: signAs, IdempotencyKey: key, Body: body})
	if err != nil {
		f.t.Fatal(err)
	}
	return f.do(key, "application/json", string(body), func(r *http.Request) {
		r.Header.Del("Authorization")
		r.Method = k.Method
		r.Header.Set(replayauth.Header, sig)
	})
}

func (f *fixture) keyValue(id int64) string {
	f.t.Helper()
	var v string
	if err := f.pool.QueryRow(context.Background(), `SELECT idempotency_key FROM idempotency_keys WHERE id = $1`, id).Scan(&v); err != nil {
		f.t.Fatal(err)
	}
	return v
}

func assertCreated(t *testing.T, r response) api.RideCreated {
	t.Helper()
	if r.Status != http.StatusCreated {
		t.Fatalf("status %d body %s, want 201", r.Status, r.Body)
	}
	var rc api.RideCreated
	if err := json.Unmarshal(r.Body, &rc); err != nil || rc.Message != api.MsgOK || rc.RideID == 0 {
		t.Fatalf("body %s", r.Body)
	}
	return rc
}

func itoa(i int64) string { return strconv.FormatInt(i, 10) }

func (f *fixture) stripeURL(t *testing.T) string { t.Helper(); return f.stripeBase }
