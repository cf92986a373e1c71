// Package replayhook carries to idemd's own tests what package
// idem/replayauth deliberately does not export: signing at a chosen time
// and nonce, a verifier or signer on another clock, and decoding a header
// without verifying it. idem/replayauth sets these in its init; tests use
// them through package replaytest's typed wrappers. Being internal, they
// cannot be reached from outside this module, so an API that imports
// replayauth has no way to produce a signature with a reused nonce or to
// read a user id out of a header it has not verified.
//
// The values are of types this package can name without importing
// replayauth (which imports it): replaytest asserts them back.
package replayhook

import "time"

var (
	// SignAt is (*replayauth.Signer).signAt: SignAt(signer, ts, nonce, req)
	// with a *replayauth.Signer and a replayauth.Request.
	SignAt func(signer any, ts int64, nonce string, req any) string
	// WithClock is withClock of a *replayauth.Signer or a
	// *replayauth.Verifier, returning the same type.
	WithClock func(signerOrVerifier any, now func() time.Time) any
	// Parse decodes a header without verifying it.
	Parse func(header string) (ts int64, nonce string, userID int64, err error)
)
