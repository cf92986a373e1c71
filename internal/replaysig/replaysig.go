// Package replaysig is the replay signature's wire format: the canonical
// string, its MAC and the header that carries them (docs/api-authors.md,
// "The replay signature"). idem/replayauth signs and verifies with it and
// is the only API an API author needs; idemd's own tests use it directly
// to build the headers replayauth refuses to produce (a chosen nonce, a
// timestamp outside the window) and to read a header without verifying it.
// Being internal, it cannot be reached from outside this module.
package replaysig

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// Errors of a header that cannot be read.
var (
	ErrMissing   = errors.New("replayauth: signature header missing")
	ErrMalformed = errors.New("replayauth: signature header malformed")
)

// Request is what a signature covers.
type Request struct {
	Method, Path   string
	UserID         int64
	IdempotencyKey string
	Body           []byte
}

// Canonical returns the string that is MACed. Fields are newline-separated;
// the method is upper-cased; the body is represented by its hex SHA-256.
// Newlines cannot appear in any field: the method and path come from an HTTP
// request line, the key is refused by a verifier if it contains one.
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

// MAC is the v1 signature of canonical with secret.
func MAC(secret []byte, canonical string) []byte {
	m := hmac.New(sha256.New, secret)
	m.Write([]byte(canonical))
	return m.Sum(nil)
}

// Sign returns the header value for r at ts with nonce, one v1 per secret.
func Sign(ts int64, nonce string, r Request, secrets ...[]byte) string {
	c := Canonical(ts, nonce, r)
	var b strings.Builder
	fmt.Fprintf(&b, "t=%d,n=%s,u=%d", ts, nonce, r.UserID)
	for _, sec := range secrets {
		b.WriteString(",v1=")
		b.WriteString(hex.EncodeToString(MAC(sec, c)))
	}
	return b.String()
}

// Header is a decoded header. Its UserID is whatever the sender wrote:
// only a verifier says whether to believe it.
type Header struct {
	Timestamp int64
	Nonce     string
	UserID    int64
	V1        [][]byte
}

// Parse decodes a header value without checking its signature.
func Parse(h string) (Header, error) {
	var p Header
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
