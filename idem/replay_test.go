package idem_test

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/idemd/idemd/idem"
	"github.com/idemd/idemd/idem/replayauth"
)

func replayFixture(t *testing.T) (*idem.Store, *replayauth.Signer, *httptest.Server) {
	t.Helper()
	s, pool := newStore(t, idem.Options{})
	ctx := context.Background()
	// User 7: one unfinished key on POST /things, one finished.
	if _, err := pool.Exec(ctx, `INSERT INTO idempotency_keys (idempotency_key, user_id, locked_at,
			request_method, request_path, request_params, recovery_point, response_code, response_body)
		VALUES ('open-key', 7, NULL, 'POST', '/things', '{}', 'started', NULL, NULL),
		       ('done-key', 7, NULL, 'POST', '/things', '{}', 'finished', 201, '{}')`); err != nil {
		t.Fatal(err)
	}
	secret, err := replayauth.NewSecret([]byte(strings.Repeat("s", 32)))
	if err != nil {
		t.Fatal(err)
	}
	signer, err := replayauth.NewSigner(secret)
	if err != nil {
		t.Fatal(err)
	}
	verifier, err := replayauth.NewVerifier(0, secret)
	if err != nil {
		t.Fatal(err)
	}
	// The protected handler echoes who it thinks the caller is and the body
	// it received.
	h := s.ReplayAuth(verifier)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		uid, ok := idem.ReplayUserID(r.Context())
		body, _ := io.ReadAll(r.Body)
		w.Header().Set("X-User", strconv.FormatInt(uid, 10))
		w.Header().Set("X-Replay", strconv.FormatBool(ok))
		_, _ = w.Write(body)
	}))
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return s, signer, srv
}

func doReplay(t *testing.T, srv *httptest.Server, method, path, key, sig string, body []byte) *http.Response {
	t.Helper()
	r, err := http.NewRequest(method, srv.URL+path, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	r.Header.Set("Content-Type", "application/json")
	if key != "" {
		r.Header.Set(replayauth.IdempotencyKeyHeader, key)
	}
	if sig != "" {
		r.Header.Set(replayauth.Header, sig)
	}
	resp, err := srv.Client().Do(r)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	return resp
}

func sign(t *testing.T, s *replayauth.Signer, method, path string, user int64, key string, body []byte) string {
	t.Helper()
	h, err := s.Sign(replayauth.Request{Method: method, Path: path, UserID: user, IdempotencyKey: key, Body: body})
	if err != nil {
		t.Fatal(err)
	}
	return h
}

func TestReplayAuthAcceptsUnfinishedKeyOfSignedUser(t *testing.T) {
	t.Parallel()
	_, signer, srv := replayFixture(t)
	body := []byte(`{"amount":100}`)
	resp := doReplay(t, srv, "POST", "/things", "open-key", sign(t, signer, "POST", "/things", 7, "open-key", body), body)
	got, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 || resp.Header.Get("X-User") != "7" || resp.Header.Get("X-Replay") != "true" {
		t.Fatalf("status %d user %s", resp.StatusCode, resp.Header.Get("X-User"))
	}
	if !bytes.Equal(got, body) {
		t.Fatalf("handler saw body %q", got)
	}
}

func TestReplayAuthPassesUnsignedRequestsThrough(t *testing.T) {
	t.Parallel()
	_, _, srv := replayFixture(t)
	resp := doReplay(t, srv, "POST", "/things", "anything", "", []byte(`x`))
	if resp.StatusCode != 200 || resp.Header.Get("X-Replay") != "false" {
		t.Fatalf("unsigned request: %d replay=%s", resp.StatusCode, resp.Header.Get("X-Replay"))
	}
}

func TestReplayAuthRejects(t *testing.T) {
	t.Parallel()
	_, signer, srv := replayFixture(t)
	body := []byte(`{}`)
	otherSecret, _ := replayauth.NewSecret([]byte(strings.Repeat("x", 32)))
	forger, _ := replayauth.NewSigner(otherSecret)
	old := signer.WithClock(func() time.Time { return time.Now().Add(-time.Hour) })

	valid := sign(t, signer, "POST", "/things", 7, "open-key", body)
	cases := []struct {
		name, method, path, key, sig string
		body                         []byte
	}{
		{"forged secret", "POST", "/things", "open-key", sign(t, forger, "POST", "/things", 7, "open-key", body), body},
		{"garbage header", "POST", "/things", "open-key", "t=1,n=2,u=7,v1=zz", body},
		{"body changed", "POST", "/things", "open-key", valid, []byte(`{"amount":1}`)},
		{"expired", "POST", "/things", "open-key", sign(t, old, "POST", "/things", 7, "open-key", body), body},
		{"unknown key", "POST", "/things", "no-such-key", sign(t, signer, "POST", "/things", 7, "no-such-key", body), body},
		{"finished key", "POST", "/things", "done-key", sign(t, signer, "POST", "/things", 7, "done-key", body), body},
		{"other user's key", "POST", "/things", "open-key", sign(t, signer, "POST", "/things", 8, "open-key", body), body},
		{"other path than stored", "POST", "/admin", "open-key", sign(t, signer, "POST", "/admin", 7, "open-key", body), body},
		{"missing key header", "POST", "/things", "", sign(t, signer, "POST", "/things", 7, "", body), body},
	}
	for _, c := range cases {
		resp := doReplay(t, srv, c.method, c.path, c.key, c.sig, c.body)
		if resp.StatusCode != http.StatusUnauthorized {
			t.Errorf("%s: status %d, want 401", c.name, resp.StatusCode)
		}
	}
	// A captured valid header cannot be replayed.
	if resp := doReplay(t, srv, "POST", "/things", "open-key", valid, body); resp.StatusCode != 200 {
		t.Fatalf("first use: %d", resp.StatusCode)
	}
	if resp := doReplay(t, srv, "POST", "/things", "open-key", valid, body); resp.StatusCode != 401 {
		t.Fatalf("second use of one nonce: %d", resp.StatusCode)
	}
}

func TestReplayAuthDisabledWithoutVerifier(t *testing.T) {
	t.Parallel()
	s, signer, _ := replayFixture(t)
	srv := httptest.NewServer(s.ReplayAuth(nil)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {})))
	defer srv.Close()
	body := []byte(`{}`)
	if resp := doReplay(t, srv, "POST", "/things", "open-key", sign(t, signer, "POST", "/things", 7, "open-key", body), body); resp.StatusCode != 401 {
		t.Fatalf("status %d", resp.StatusCode)
	}
}
