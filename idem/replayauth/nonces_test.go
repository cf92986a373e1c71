package replayauth

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"
)

// clock is an injected clock tests move by hand.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time   { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) set(t time.Time)  { c.mu.Lock(); c.t = t; c.mu.Unlock() }
func newClock(t time.Time) *clock { return &clock{t: t} }
func ctxb() context.Context       { return context.Background() }
func mustUse(t *testing.T, m *MemoryNonces, n string, exp time.Time) bool {
	t.Helper()
	fresh, err := m.Use(ctxb(), n, exp)
	if err != nil {
		t.Fatal(err)
	}
	return fresh
}

// The old in-memory cache refused every new signature once it held 100,000
// live nonces. Nothing refuses on count now: a verifier accepts more valid
// signatures than that within one skew window, each exactly once.
func TestVerifierHasNoNonceCeiling(t *testing.T) {
	s := secrets(t, []string{strings.Repeat("k", 32)})[0]
	now := time.Unix(1_800_000_000, 0)
	v, err := NewVerifier(0, s)
	if err != nil {
		t.Fatal(err)
	}
	v = v.WithClock(func() time.Time { return now })
	signer := mustSigner(t, s)
	req := Request{Method: "POST", Path: "/rides", UserID: 3, IdempotencyKey: "k"}
	const n = 120_000 // more than the old ceiling of 100,000
	for i := range n {
		h := signer.signAt(now.Unix(), fmt.Sprintf("n%d", i), req)
		if _, err := v.Verify(ctxb(), h, req); err != nil {
			t.Fatalf("signature %d of %d, all within one window: %v", i+1, n, err)
		}
	}
	if got := v.mem.Len(); got != n {
		t.Fatalf("store holds %d nonces, want %d", got, n)
	}
	// Every one of them is still refused as a replay.
	for _, i := range []int{0, n / 2, n - 1} {
		h := signer.signAt(now.Unix(), fmt.Sprintf("n%d", i), req)
		if _, err := v.Verify(ctxb(), h, req); !errors.Is(err, ErrReplayed) {
			t.Fatalf("replay of nonce %d: %v, want ErrReplayed", i, err)
		}
	}
}

// MemoryNonces forgets a nonce when it expires, by its own clock, and
// drops expired entries on a sweep, so it is bounded by rate × window and
// keeps accepting beyond any size.
func TestMemoryNoncesExpireByTime(t *testing.T) {
	t0 := time.Unix(1_800_000_000, 0)
	c := newClock(t0)
	m := NewMemoryNonces(c.now)
	window := DefaultSkew

	if !mustUse(t, m, "a", t0.Add(window)) {
		t.Fatal("first use of a refused")
	}
	if mustUse(t, m, "a", t0.Add(window)) {
		t.Fatal("second use of a within its window accepted")
	}
	c.set(t0.Add(window - time.Second))
	if mustUse(t, m, "a", t0.Add(window)) {
		t.Fatal("use of a one second before it expires accepted")
	}
	// Expired: its signature can no longer pass the window (which includes
	// its last instant), and the nonce may be recorded again.
	c.set(t0.Add(window + time.Nanosecond))
	if !mustUse(t, m, "a", c.now().Add(window)) {
		t.Fatal("use of a after it expired refused")
	}

	// 150,000 nonces expiring within the window, then 150,000 more after
	// they expired: every one is fresh, and a sweep drops the first lot.
	base := c.now()
	const n = 150_000
	for i := range n {
		if !mustUse(t, m, fmt.Sprintf("x%d", i), base.Add(window)) {
			t.Fatalf("nonce x%d refused", i)
		}
	}
	c.set(base.Add(window + MemorySweepInterval))
	for i := range n {
		if !mustUse(t, m, fmt.Sprintf("y%d", i), c.now().Add(window)) {
			t.Fatalf("nonce y%d refused", i)
		}
	}
	if got := m.Len(); got != n {
		t.Fatalf("store holds %d nonces after the sweep, want the %d live ones", got, n)
	}
	// The swept ones are usable again; the live ones are still refused.
	if !mustUse(t, m, "x7", c.now().Add(window)) || mustUse(t, m, "y7", c.now().Add(window)) {
		t.Fatal("after the sweep: x7 should be fresh and y7 a replay")
	}
}

type failingStore struct{ err error }

func (f failingStore) Use(context.Context, string, time.Time) (bool, error) { return false, f.err }

type recordingStore struct {
	mu   sync.Mutex
	used map[string]time.Time
}

func (r *recordingStore) Use(_ context.Context, n string, exp time.Time) (bool, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.used[n]; ok {
		return false, nil
	}
	r.used[n] = exp
	return true, nil
}

// A store that cannot record the nonce fails closed: the request is
// refused with ErrNonceStore (a 503 for the caller), never accepted.
func TestVerifyFailsClosedOnNonceStoreError(t *testing.T) {
	s := secrets(t, []string{strings.Repeat("k", 32)})[0]
	now := time.Unix(1_800_000_000, 0)
	v, _ := NewVerifier(0, s)
	down := errors.New("connection refused")
	v = v.WithClock(func() time.Time { return now }).WithNonceStore(failingStore{down})
	req := Request{Method: "POST", Path: "/rides", UserID: 4, IdempotencyKey: "k"}
	uid, err := v.Verify(ctxb(), mustSigner(t, s).signAt(now.Unix(), "n", req), req)
	if uid != 0 || !errors.Is(err, ErrNonceStore) || !errors.Is(err, down) {
		t.Fatalf("uid %d err %v, want 0 and ErrNonceStore wrapping the store's error", uid, err)
	}
	if errors.Is(err, ErrReplayed) {
		t.Fatal("a store failure must not read as a replay")
	}
	// A forged signature never reaches the store: it is ErrMismatch, so a
	// forger can neither fill the store nor learn that it is down.
	forged := mustSigner(t, secrets(t, []string{strings.Repeat("x", 32)})...).signAt(now.Unix(), "f", req)
	if _, err := v.Verify(ctxb(), forged, req); !errors.Is(err, ErrMismatch) {
		t.Fatalf("forged: %v, want ErrMismatch", err)
	}
}

// The verifier hands its store each nonce with the end of its signature's
// window as expiry, and verifiers sharing a store refuse each other's
// nonces.
func TestVerifiersShareNonceStore(t *testing.T) {
	s := secrets(t, []string{strings.Repeat("k", 32)})[0]
	now := time.Unix(1_800_000_000, 0)
	store := &recordingStore{used: map[string]time.Time{}}
	a, _ := NewVerifier(0, s)
	b, _ := NewVerifier(0, s)
	a = a.WithClock(func() time.Time { return now }).WithNonceStore(store)
	b = b.WithClock(func() time.Time { return now }).WithNonceStore(store)
	if a.NonceStore() != store || b.NonceStore() != store {
		t.Fatal("NonceStore does not return the store given")
	}
	if v, _ := NewVerifier(0, s); v.NonceStore() != nil {
		t.Fatal("NewVerifier's default (process memory) should report nil")
	}
	req := Request{Method: "POST", Path: "/rides", UserID: 5, IdempotencyKey: "k"}
	ts := now.Add(-time.Minute)
	h := mustSigner(t, s).signAt(ts.Unix(), "shared", req)
	if _, err := a.Verify(ctxb(), h, req); err != nil {
		t.Fatalf("first use on a: %v", err)
	}
	if _, err := b.Verify(ctxb(), h, req); !errors.Is(err, ErrReplayed) {
		t.Fatalf("replay on b: %v, want ErrReplayed", err)
	}
	if got, want := store.used["shared"], ts.Add(DefaultSkew); !got.Equal(want) {
		t.Fatalf("expiry recorded %v, want %v (timestamp + skew)", got, want)
	}
}

// A verifier's own memory expires nonces by the verifier's clock (the one
// withClock sets), not the wall clock: a verifier living in the past still
// refuses a replay within its window.
func TestDefaultMemoryFollowsVerifierClock(t *testing.T) {
	s := secrets(t, []string{strings.Repeat("k", 32)})[0]
	past := time.Unix(1_500_000_000, 0) // 2017: long expired by the wall clock
	c := newClock(past)
	v, _ := NewVerifier(0, s)
	v = v.WithClock(c.now)
	req := Request{Method: "POST", Path: "/rides", UserID: 6, IdempotencyKey: "k"}
	h := mustSigner(t, s).signAt(past.Unix(), "old", req)
	if _, err := v.Verify(ctxb(), h, req); err != nil {
		t.Fatalf("first use: %v", err)
	}
	if _, err := v.Verify(ctxb(), h, req); !errors.Is(err, ErrReplayed) {
		t.Fatalf("replay within the verifier's window: %v, want ErrReplayed", err)
	}
	c.set(past.Add(DefaultSkew + time.Second))
	if _, err := v.Verify(ctxb(), h, req); !errors.Is(err, ErrExpired) {
		t.Fatalf("after the window: %v, want ErrExpired", err)
	}
}

// At exactly its expiry a signature still passes the window, so its nonce
// must still be refused then; one instant later it may be forgotten.
func TestMemoryNoncesRememberThroughTheExpiryInstant(t *testing.T) {
	m := NewMemoryNonces(nil)
	t0 := time.Unix(1_700_000_000, 0)
	exp := t0.Add(DefaultSkew)
	if !m.useAt("n", exp, t0) {
		t.Fatal("first use refused")
	}
	if m.useAt("n", exp, exp) {
		t.Fatal("nonce accepted again at the instant its signature still passes the window")
	}
	if !m.useAt("n", exp.Add(2*MemorySweepInterval), exp.Add(time.Nanosecond).Add(MemorySweepInterval)) {
		t.Fatal("nonce still refused after its expiry")
	}
}
