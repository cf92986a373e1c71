// Package replayauth signs and verifies the internal authentication path the
// completer uses to replay an abandoned request on behalf of the key's user.
//
// The signature is HMAC-SHA256 over a canonical string of the timestamp, a
// nonce, the method, the path, the user id, the idempotency key and the
// SHA-256 digest of the body, carried Stripe-webhook style in one header:
//
//	Idemd-Replay-Signature: t=1767225600,n=6f1c...,u=42,v1=ab12...[,v1=...]
//
// Several v1 values may be present: a signer holding two secrets during a
// rotation signs with both, and a verifier accepts the request when any v1
// matches any secret it holds, so the completer and the API can be rolled in
// either order. Comparison is constant-time; a nonce is accepted once within
// the skew window, recorded in a NonceStore (shared by every API replica
// when it is PostgreSQL's, see idem.ReplayNonces); secrets are never
// formatted into errors or logs.
//
// The canonical string (see Canonical) is documented in docs/api-authors.md
// with test vectors in testdata/vectors.json, so an API in another language
// can implement the verifier.
package replayauth

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/idemd/idemd/internal/replaysig"
)

// Header carries the signature.
const Header = "Idemd-Replay-Signature"

// IdempotencyKeyHeader is the header the replayed request carries its key in.
const IdempotencyKeyHeader = "Idempotency-Key"

// DefaultSkew is the accepted clock difference between signer and verifier.
const DefaultSkew = 5 * time.Minute

// MinSecretLen is the shortest secret accepted (bytes): 256 bits.
const MinSecretLen = 32

// Errors a verifier returns for a request it refuses. All of them map to
// HTTP 401 (ErrNonceStore, below, is a 503).
var (
	ErrMissing   = replaysig.ErrMissing
	ErrMalformed = replaysig.ErrMalformed
	ErrExpired   = errors.New("replayauth: timestamp outside the skew window")
	ErrMismatch  = errors.New("replayauth: no signature matches")
	ErrReplayed  = errors.New("replayauth: nonce already used")
)

// ErrNonceStore wraps a failure to record a nonce (its store, the database,
// was unreachable). It is the verifier's failure, not the caller's: the
// request is refused (fail closed), but with a retryable status (503), not
// 401.
var ErrNonceStore = errors.New("replayauth: nonce store unavailable")

// Request is what a signature covers.
type Request = replaysig.Request

// Secret is an HMAC key. Its String method never reveals it.
type Secret struct{ b []byte }

// NewSecret wraps raw key bytes; it rejects keys shorter than MinSecretLen.
func NewSecret(b []byte) (Secret, error) {
	if len(b) < MinSecretLen {
		return Secret{}, fmt.Errorf("replayauth: secret is %d bytes, need at least %d", len(b), MinSecretLen)
	}
	return Secret{b: append([]byte(nil), b...)}, nil
}

func (Secret) String() string   { return "[redacted]" }
func (Secret) GoString() string { return "[redacted]" }

// ReadSecretFile reads one secret from a file (a mounted Kubernetes Secret),
// ignoring surrounding whitespace.
func ReadSecretFile(path string) (Secret, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return Secret{}, fmt.Errorf("replayauth: read secret file: %w", err)
	}
	s, err := NewSecret([]byte(strings.TrimSpace(string(b))))
	if err != nil {
		return Secret{}, fmt.Errorf("%w (file %s)", err, path)
	}
	return s, nil
}

// ReadSecretFiles reads one to two secret files (current, and previous during a
// rotation), skipping empty paths.
func ReadSecretFiles(paths ...string) ([]Secret, error) {
	var out []Secret
	for _, p := range paths {
		if p == "" {
			continue
		}
		s, err := ReadSecretFile(p)
		if err != nil {
			return nil, err
		}
		out = append(out, s)
	}
	if len(out) == 0 {
		return nil, errors.New("replayauth: no secret configured")
	}
	return out, nil
}

// Canonical returns the string that is MACed. Fields are newline-separated;
// the method is upper-cased; the body is represented by its hex SHA-256.
// Newlines cannot appear in any field: the method and path come from an HTTP
// request line, the key is rejected by Verify if it contains one.
func Canonical(ts int64, nonce string, r Request) string { return replaysig.Canonical(ts, nonce, r) }

// Signer produces signature headers.
type Signer struct {
	secrets []Secret
	now     func() time.Time
}

// NewSigner signs with every given secret (one, or two during a rotation).
func NewSigner(secrets ...Secret) (*Signer, error) {
	if len(secrets) == 0 {
		return nil, errors.New("replayauth: signer needs a secret")
	}
	return &Signer{secrets: secrets, now: time.Now}, nil
}

// WithClock returns a copy of the signer that takes its timestamps from
// now: an API's tests sign a replay in the past or the future with it.
func (s *Signer) WithClock(now func() time.Time) *Signer {
	c := *s
	c.now = now
	return &c
}

// Sign returns the header value for r with a fresh nonce.
func (s *Signer) Sign(r Request) (string, error) {
	nb := make([]byte, 16)
	if _, err := rand.Read(nb); err != nil {
		return "", fmt.Errorf("replayauth: nonce: %w", err)
	}
	return s.signAt(s.now().Unix(), hex.EncodeToString(nb), r), nil
}

// signAt returns the header value for r at a given timestamp and nonce.
// Unexported: a real signature's nonce must be fresh.
func (s *Signer) signAt(ts int64, nonce string, r Request) string {
	raw := make([][]byte, len(s.secrets))
	for i, sec := range s.secrets {
		raw[i] = sec.b
	}
	return replaysig.Sign(ts, nonce, r, raw...)
}

// Verifier checks signature headers.
type Verifier struct {
	secrets []Secret
	skew    time.Duration
	now     func() time.Time
	// nonces is the store given with WithNonceStore; nil means mem, the
	// verifier's own process memory, on the verifier's clock.
	nonces NonceStore
	mem    *MemoryNonces
}

// NewVerifier accepts a request signed with any of secrets within skew
// (DefaultSkew when zero). It remembers nonces in its own process memory
// (a MemoryNonces) until WithNonceStore gives it a shared store: an API
// with more than one replica needs one (idem.ReplayNonces, in PostgreSQL),
// or a nonce used on one replica is accepted again by another.
func NewVerifier(skew time.Duration, secrets ...Secret) (*Verifier, error) {
	if len(secrets) == 0 {
		return nil, errors.New("replayauth: verifier needs a secret")
	}
	if skew <= 0 {
		skew = DefaultSkew
	}
	return &Verifier{secrets: secrets, skew: skew, now: time.Now, mem: NewMemoryNonces(nil)}, nil
}

// WithClock returns a verifier sharing the nonce store but judging the
// skew window by now: an API's tests check a signature at a given time
// with it.
func (v *Verifier) WithClock(now func() time.Time) *Verifier {
	c := *v
	c.now = now
	return &c
}

// WithNonceStore returns a verifier that records nonces in ns instead.
func (v *Verifier) WithNonceStore(ns NonceStore) *Verifier {
	c := *v
	c.nonces = ns
	return &c
}

// NonceStore returns the store given with WithNonceStore, or nil when the
// verifier remembers nonces in its own process memory (NewVerifier's
// default).
func (v *Verifier) NonceStore() NonceStore { return v.nonces }

// Verify checks header against r, whose UserID is taken from the header.
// On success it returns the signed user id. The nonce is recorded (see
// NonceStore) only after the MAC checks out, so forged headers cannot fill
// the store, with the time its signature stops passing the skew window as
// its expiry. An error of the nonce store fails closed: Verify returns an
// error wrapping ErrNonceStore and the store's error, never an acceptance.
func (v *Verifier) Verify(ctx context.Context, header string, r Request) (int64, error) {
	p, err := replaysig.Parse(header)
	if err != nil {
		return 0, err
	}
	if strings.ContainsAny(r.IdempotencyKey, "\n\r") || strings.ContainsAny(r.Path, "\n\r") {
		return 0, ErrMalformed
	}
	now := v.now()
	ts := time.Unix(p.Timestamp, 0)
	if d := now.Sub(ts); d > v.skew || d < -v.skew {
		return 0, ErrExpired
	}
	r.UserID = p.UserID
	c := Canonical(p.Timestamp, p.Nonce, r)
	ok := 0
	for _, sec := range v.secrets {
		want := replaysig.MAC(sec.b, c)
		for _, got := range p.V1 {
			// Every comparison runs, so timing reveals nothing about which
			// secret or signature matched.
			ok |= eq(want, got)
		}
	}
	if ok == 0 {
		return 0, ErrMismatch
	}
	var fresh bool
	if v.nonces != nil {
		if fresh, err = v.nonces.Use(ctx, p.Nonce, ts.Add(v.skew)); err != nil {
			return 0, fmt.Errorf("%w: %w", ErrNonceStore, err)
		}
	} else {
		// Its own memory expires nonces by the verifier's clock, the one
		// that checked the window.
		fresh = v.mem.useAt(p.Nonce, ts.Add(v.skew), now)
	}
	if !fresh {
		return 0, ErrReplayed
	}
	return p.UserID, nil
}

func boolToInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

func eq(a, b []byte) int { return boolToInt(hmac.Equal(a, b)) }
