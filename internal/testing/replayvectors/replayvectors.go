// Package replayvectors is the shape of the replay signature's published
// test vectors (idem/replayauth/testdata/vectors.json; docs/api-authors.md,
// "The replay signature"): clients' generator writes them and every
// verifier's tests, Go's among them, read them. It imports nothing of
// idemd's, so replayauth's own tests can use it.
package replayvectors

// Vector is one signed request and what verifiers must make of it. The
// first fields are the signed request and what Go's signer makes of it;
// Steps are what a verifier holding VerifierSecrets, with a skew window of
// Skew seconds and one nonce store for the whole vector, is given, in
// order, with its clock at Now, and what it must answer.
type Vector struct {
	Name            string   `json:"name"`
	Secrets         []string `json:"secrets"`
	Timestamp       int64    `json:"timestamp"`
	Nonce           string   `json:"nonce"`
	Method          string   `json:"method"`
	Path            string   `json:"path"`
	UserID          int64    `json:"user_id"`
	Key             string   `json:"idempotency_key"`
	Body            string   `json:"body"`
	Canonical       string   `json:"canonical"`
	Header          string   `json:"header"`
	VerifierSecrets []string `json:"verifier_secrets"`
	Skew            int64    `json:"skew"`
	Steps           []Step   `json:"steps"`
}

// Step is one request a verifier is given and its expected answer.
type Step struct {
	Now     float64 `json:"now"`
	Header  string  `json:"header"`
	Request Request `json:"request"`
	// Expect is ok, or the refusal: missing, malformed, expired, mismatch,
	// replayed (replayauth's ErrMissing ... ErrReplayed).
	Expect string `json:"expect"`
	// UserID is the accepted user id, in decimal (a string: JavaScript's
	// numbers cannot hold every int64); empty unless Expect is ok.
	UserID string `json:"user_id,omitempty"`
}

// Request is what a step's request carries besides its header.
type Request struct {
	Method string `json:"method"`
	Path   string `json:"path"`
	Key    string `json:"idempotency_key"`
	Body   string `json:"body"`
}
