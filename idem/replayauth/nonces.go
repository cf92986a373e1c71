package replayauth

import (
	"context"
	"sync"
	"time"
)

// NonceStore records the nonces of accepted signatures. Use records nonce
// until expires (the time its signature stops passing the skew window) and
// reports whether it was fresh: false when the nonce is already recorded
// and not expired, which the verifier refuses as a replay. Use must be
// atomic: of two concurrent calls with one nonce, at most one is fresh,
// across every verifier sharing the store. An error means nothing is known
// about the nonce; the verifier refuses the request (ErrNonceStore).
//
// A store holds each nonce only until it expires and has no capacity: it
// never refuses a fresh nonce because it holds many. idem.ReplayNonces
// keeps them in PostgreSQL, shared by every API replica; MemoryNonces in
// one process.
type NonceStore interface {
	Use(ctx context.Context, nonce string, expires time.Time) (fresh bool, err error)
}

// MemorySweepInterval is how often MemoryNonces drops expired nonces.
const MemorySweepInterval = time.Minute

// MemoryNonces is a NonceStore in process memory: for an API with one
// process, and tests. Replicas of an API each have their own, so a nonce
// used on one is accepted by another; use a shared store there. It holds a
// nonce until it expires (by its own clock) and drops expired nonces at
// most once per MemorySweepInterval, so it holds about (accepted
// signatures per second) × (skew window + MemorySweepInterval) entries,
// with no fixed capacity.
type MemoryNonces struct {
	now func() time.Time

	mu        sync.Mutex
	seen      map[string]time.Time
	nextSweep time.Time
}

// NewMemoryNonces returns an empty store that reads the time from now
// (time.Now when nil).
func NewMemoryNonces(now func() time.Time) *MemoryNonces {
	if now == nil {
		now = time.Now
	}
	return &MemoryNonces{now: now, seen: make(map[string]time.Time)}
}

// Use implements NonceStore. It never fails.
func (m *MemoryNonces) Use(_ context.Context, nonce string, expires time.Time) (bool, error) {
	return m.useAt(nonce, expires, m.now()), nil
}

func (m *MemoryNonces) useAt(nonce string, expires, now time.Time) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	if !now.Before(m.nextSweep) {
		for k, exp := range m.seen {
			if now.After(exp) {
				delete(m.seen, k)
			}
		}
		m.nextSweep = now.Add(MemorySweepInterval)
	}
	// A signature still passes the window at exactly its expiry (the
	// window is inclusive), so the nonce is remembered through that instant.
	if exp, ok := m.seen[nonce]; ok && !now.After(exp) {
		return false
	}
	m.seen[nonce] = expires
	return true
}

// Len returns how many nonces the store holds, expired ones not yet swept
// included.
func (m *MemoryNonces) Len() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.seen)
}
