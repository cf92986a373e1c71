// Package replaytest gives idemd's tests what idem/replayauth keeps out of
// its public surface because only a test needs it (see
// github.com/idemd/idemd/internal/replayhook): signatures at a chosen time and nonce, signers
// and verifiers on another clock, and headers decoded without being
// verified. An API's own tests do not need any of it: they sign with a
// replayauth.Signer and send the request through idem's ReplayAuth.
package replaytest

import (
	"time"

	"github.com/idemd/idemd/idem/replayauth"
	"github.com/idemd/idemd/internal/replayhook"
)

// SignAt returns the header s would send for r at ts with nonce.
func SignAt(s *replayauth.Signer, ts int64, nonce string, r replayauth.Request) string {
	return replayhook.SignAt(s, ts, nonce, r)
}

// SignerWithClock returns a copy of s that reads the time from now.
func SignerWithClock(s *replayauth.Signer, now func() time.Time) *replayauth.Signer {
	return replayhook.WithClock(s, now).(*replayauth.Signer)
}

// VerifierWithClock returns a copy of v (sharing its nonce store) whose
// skew window is measured from now.
func VerifierWithClock(v *replayauth.Verifier, now func() time.Time) *replayauth.Verifier {
	return replayhook.WithClock(v, now).(*replayauth.Verifier)
}

// Header is a signature header's fields, as sent: nothing in it is
// verified.
type Header struct {
	Timestamp int64
	Nonce     string
	UserID    int64
}

// Parse decodes a signature header without verifying it.
func Parse(h string) (Header, error) {
	ts, nonce, user, err := replayhook.Parse(h)
	return Header{Timestamp: ts, Nonce: nonce, UserID: user}, err
}
