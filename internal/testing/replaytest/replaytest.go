// Package replaytest gives idemd's tests the replay signatures
// idem/replayauth will not produce, because only a test needs them: a
// header at a chosen time and nonce (a replayed, expired or forged one),
// and a header decoded without being verified. It builds them with the
// signature's wire format (internal/replaysig) from the raw secrets, as
// any signer in another language would. An API's own tests need none of
// it: they sign with a replayauth.Signer (WithClock for another time).
package replaytest

import (
	"github.com/idemd/idemd/idem/replayauth"
	"github.com/idemd/idemd/internal/replaysig"
)

// SignAt returns the header a signer holding secrets sends for r at ts
// with nonce.
func SignAt(ts int64, nonce string, r replayauth.Request, secrets ...[]byte) string {
	return replaysig.Sign(ts, nonce, r, secrets...)
}

// Header is a decoded header.
type Header = replaysig.Header

// Parse decodes a header without verifying it.
func Parse(h string) (Header, error) { return replaysig.Parse(h) }
