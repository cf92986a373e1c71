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
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
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
	ErrMissing   = errors.New("replayauth: signature header missing")
	ErrMalformed = errors.New("replayauth: signature header malformed")
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
type Request struct {
	Method         string
	Path           string // the request path (no query string)
	UserID         int64
	IdempotencyKey string
	Body           []byte
}

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
func Canonical(ts int64, nonce string, r Request) string {
	digest := sha256.Sum256(r.Body)
	return strings.Join([]string{
		"idemd-replay-v1",
		strconv.FormatInt(ts, 10),
		nonce,
		strings.ToUpper(r.Method),
		r.Path,
		strconv.FormatInt(r.UserID, 10),
		r.IdempotencyKey,
		hex.EncodeToString(digest[:]),
	}, "\n")
}

func mac(s Secret, canonical string) []byte {
	m := hmac.New(sha256.New, s.b)
	m.Write([]byte(canonical))
	return m.Sum(nil)
}

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

// withClock returns a copy of the signer using now (tests, through
// github.com/idemd/idemd/internal/replaytest).
func (s *Signer) withClock(now func() time.Time) *Signer {
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

// signAt returns the header value for r at a given timestamp and nonce:
// for the test vectors and idemd's own tests (github.com/idemd/idemd/internal/replaytest),
// never for a real signature, whose nonce must be fresh.
func (s *Signer) signAt(ts int64, nonce string, r Request) string {
	c := Canonical(ts, nonce, r)
	var b strings.Builder
	fmt.Fprintf(&b, "t=%d,n=%s,u=%d", ts, nonce, r.UserID)
	for _, sec := range s.secrets {
		b.WriteString(",v1=")
		b.WriteString(hex.EncodeToString(mac(sec, c)))
	}
	return b.String()
}

// parsed is a decoded header.
type parsed struct {
	Timestamp int64
	Nonce     string
	UserID    int64
	V1        [][]byte
}

// parse decodes a header value without checking it. Unexported: its
// UserID is whatever the sender wrote, and only Verify says whether to
// believe it.
func parse(h string) (parsed, error) {
	var p parsed
	if h == "" {
		return p, ErrMissing
	}
	var haveT, haveN, haveU bool
	for _, part := range strings.Split(h, ",") {
		k, v, ok := strings.Cut(strings.TrimSpace(part), "=")
		if !ok {
			return p, ErrMalformed
		}
		switch k {
		case "t":
			ts, err := strconv.ParseInt(v, 10, 64)
			if err != nil || haveT {
				return p, ErrMalformed
			}
			p.Timestamp, haveT = ts, true
		case "n":
			if v == "" || len(v) > 64 || haveN {
				return p, ErrMalformed
			}
			p.Nonce, haveN = v, true
		case "u":
			u, err := strconv.ParseInt(v, 10, 64)
			if err != nil || haveU {
				return p, ErrMalformed
			}
			p.UserID, haveU = u, true
		case "v1":
			sig, err := hex.DecodeString(v)
			if err != nil || len(sig) != sha256.Size {
				return p, ErrMalformed
			}
			if len(p.V1) >= 4 {
				return p, ErrMalformed
			}
			p.V1 = append(p.V1, sig)
		default:
			// Unknown schemes are ignored, as Stripe does, so a future v2
			// can be added alongside v1.
		}
	}
	if !haveT || !haveN || !haveU || len(p.V1) == 0 {
		return p, ErrMalformed
	}
	return p, nil
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

// withClock returns a verifier sharing the nonce store but using now for
// the skew window (tests, through github.com/idemd/idemd/internal/replaytest).
func (v *Verifier) withClock(now func() time.Time) *Verifier {
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
	p, err := parse(header)
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
		want := mac(sec, c)
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
