package replayauth

import (
	"context"
	"encoding/json"
	"errors"
	"math"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/idemd/idemd/internal/testing/replayvectors"
)

type vector = replayvectors.Vector

// vectorErrors are the refusals a step may expect, by name.
var vectorErrors = map[string]error{
	"ok": nil, "missing": ErrMissing, "malformed": ErrMalformed, "expired": ErrExpired,
	"mismatch": ErrMismatch, "replayed": ErrReplayed,
}

func loadVectors(t *testing.T) []vector {
	t.Helper()
	b, err := os.ReadFile("testdata/vectors.json")
	if err != nil {
		t.Fatal(err)
	}
	var vs []vector
	if err := json.Unmarshal(b, &vs); err != nil {
		t.Fatal(err)
	}
	if len(vs) < 2 {
		t.Fatalf("expected several vectors, got %d", len(vs))
	}
	return vs
}

func secrets(t *testing.T, raw []string) []Secret {
	t.Helper()
	var out []Secret
	for _, r := range raw {
		s, err := NewSecret([]byte(r))
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, s)
	}
	return out
}

// The published vectors pin the wire format: a change to Canonical or the
// header layout breaks every other-language verifier and must fail here.
func TestVectors(t *testing.T) {
	for _, v := range loadVectors(t) {
		t.Run(v.Name, func(t *testing.T) {
			req := Request{Method: v.Method, Path: v.Path, UserID: v.UserID, IdempotencyKey: v.Key, Body: []byte(v.Body)}
			if got := Canonical(v.Timestamp, v.Nonce, req); got != v.Canonical {
				t.Fatalf("canonical:\n got %q\nwant %q", got, v.Canonical)
			}
			signer, err := NewSigner(secrets(t, v.Secrets)...)
			if err != nil {
				t.Fatal(err)
			}
			if got := signer.signAt(v.Timestamp, v.Nonce, req); got != v.Header {
				t.Fatalf("header:\n got %s\nwant %s", got, v.Header)
			}
			if len(v.Steps) == 0 {
				t.Fatal("vector has no steps")
			}
			ver, err := NewVerifier(time.Duration(v.Skew)*time.Second, secrets(t, v.VerifierSecrets)...)
			if err != nil {
				t.Fatal(err)
			}
			for i, st := range v.Steps {
				want, known := vectorErrors[st.Expect]
				if !known {
					t.Fatalf("step %d: unknown expect %q", i, st.Expect)
				}
				sec, frac := math.Modf(st.Now)
				now := time.Unix(int64(sec), int64(math.Round(frac*1e9)))
				r := Request{Method: st.Request.Method, Path: st.Request.Path, IdempotencyKey: st.Request.Key, Body: []byte(st.Request.Body)}
				uid, err := ver.WithClock(func() time.Time { return now }).Verify(context.Background(), st.Header, r)
				if !errors.Is(err, want) || (want == nil) != (err == nil) {
					t.Fatalf("step %d: got %v, want %s", i, err, st.Expect)
				}
				if want == nil && strconv.FormatInt(uid, 10) != st.UserID {
					t.Fatalf("step %d: user %d, want %s", i, uid, st.UserID)
				}
			}
		})
	}
}

func TestRejections(t *testing.T) {
	cur := secrets(t, []string{strings.Repeat("c", 32)})[0]
	prev := secrets(t, []string{strings.Repeat("p", 32)})[0]
	other := secrets(t, []string{strings.Repeat("x", 32)})[0]
	base := time.Unix(1_800_000_000, 0)
	req := Request{Method: "POST", Path: "/rides", UserID: 7, IdempotencyKey: "key-1", Body: []byte(`{"origin_lat":1}`)}

	sign := func(s *Signer, at time.Time, nonce string, r Request) string { return s.signAt(at.Unix(), nonce, r) }
	signer, _ := NewSigner(cur)
	newVerifier := func(ss ...Secret) *Verifier {
		v, err := NewVerifier(DefaultSkew, ss...)
		if err != nil {
			t.Fatal(err)
		}
		return v.WithClock(func() time.Time { return base })
	}

	cases := []struct {
		name   string
		header string
		req    Request
		v      *Verifier
		want   error
	}{
		{"missing", "", req, newVerifier(cur), ErrMissing},
		{"garbage", "hello", req, newVerifier(cur), ErrMalformed},
		{"no v1", "t=1,n=a,u=7", req, newVerifier(cur), ErrMalformed},
		{"short v1", "t=1,n=a,u=7,v1=abcd", req, newVerifier(cur), ErrMalformed},
		{"forged secret", sign(mustSigner(t, other), base, "n1", req), req, newVerifier(cur), ErrMismatch},
		{"altered body", sign(signer, base, "n2", req), withBody(req, `{"origin_lat":2}`), newVerifier(cur), ErrMismatch},
		{"altered path", sign(signer, base, "n3", req), withPath(req, "/rides/2"), newVerifier(cur), ErrMismatch},
		{"altered key", sign(signer, base, "n4", req), withKey(req, "key-2"), newVerifier(cur), ErrMismatch},
		{"altered method", sign(signer, base, "n5", req), withMethod(req, "PUT"), newVerifier(cur), ErrMismatch},
		{"wrong user", strings.Replace(sign(signer, base, "n6", req), "u=7", "u=8", 1), req, newVerifier(cur), ErrMismatch},
		{"expired", sign(signer, base.Add(-DefaultSkew-time.Second), "n7", req), req, newVerifier(cur), ErrExpired},
		{"future", sign(signer, base.Add(DefaultSkew+time.Second), "n8", req), req, newVerifier(cur), ErrExpired},
		{"skew edge past", sign(signer, base.Add(-DefaultSkew), "n9", req), req, newVerifier(cur), nil},
		{"skew edge future", sign(signer, base.Add(DefaultSkew), "n10", req), req, newVerifier(cur), nil},
		{"rotation: verifier has both", sign(signer, base, "n11", req), req, newVerifier(prev, cur), nil},
		{"rotation: signer has both", sign(mustSigner(t, prev, cur), base, "n12", req), req, newVerifier(prev), nil},
		{"rotation: old secret removed", sign(mustSigner(t, prev), base, "n13", req), req, newVerifier(cur), ErrMismatch},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := c.v.Verify(context.Background(), c.header, c.req)
			if !errors.Is(err, c.want) {
				t.Fatalf("got %v, want %v", err, c.want)
			}
		})
	}
}

func TestReplayedNonceRejected(t *testing.T) {
	s := secrets(t, []string{strings.Repeat("k", 40)})[0]
	now := time.Unix(1_800_000_000, 0)
	v, _ := NewVerifier(0, s)
	v = v.WithClock(func() time.Time { return now })
	req := Request{Method: "POST", Path: "/rides", UserID: 1, IdempotencyKey: "k"}
	h := mustSigner(t, s).signAt(now.Unix(), "once", req)
	if _, err := v.Verify(context.Background(), h, req); err != nil {
		t.Fatalf("first use: %v", err)
	}
	if _, err := v.Verify(context.Background(), h, req); !errors.Is(err, ErrReplayed) {
		t.Fatalf("second use: got %v, want ErrReplayed", err)
	}
}

func TestSecretsNeverFormatted(t *testing.T) {
	raw := strings.Repeat("s", 32)
	s := secrets(t, []string{raw})[0]
	for _, out := range []string{s.String(), s.GoString()} {
		if strings.Contains(out, raw) {
			t.Fatal("secret leaked through formatting")
		}
	}
	if _, err := NewSecret([]byte("short")); err == nil {
		t.Fatal("short secret accepted")
	}
}

func TestReadSecretFiles(t *testing.T) {
	dir := t.TempDir()
	p := dir + "/cur"
	if err := os.WriteFile(p, []byte(strings.Repeat("a", 32)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	ss, err := ReadSecretFiles(p, "")
	if err != nil || len(ss) != 1 {
		t.Fatalf("got %d secrets, err %v", len(ss), err)
	}
	if _, err := ReadSecretFiles(dir + "/missing"); err == nil {
		t.Fatal("missing file accepted")
	}
}

func mustSigner(t *testing.T, ss ...Secret) *Signer {
	t.Helper()
	s, err := NewSigner(ss...)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func withBody(r Request, b string) Request   { r.Body = []byte(b); return r }
func withPath(r Request, p string) Request   { r.Path = p; return r }
func withKey(r Request, k string) Request    { r.IdempotencyKey = k; return r }
func withMethod(r Request, m string) Request { r.Method = m; return r }
