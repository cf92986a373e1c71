package idem

import (
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
)

// ReplayedHeader is set on responses served from a finished key, as Stripe
// does, so a client can tell a replay from a first execution.
const ReplayedHeader = "Idempotent-Replayed"

// Messages of the error responses WriteError sends, in the article's
// {"error": "..."} envelope.
const (
	MsgKeyMissing     = "Please specify an idempotency key with the Idempotency-Key header."
	MsgKeyInvalid     = "Idempotency-Key must be UTF-8 text without control characters."
	MsgParamsMismatch = "There was a mismatch between this request's parameters and the parameters of a previously stored request with the same Idempotency-Key."
	MsgInProgress     = "An API request with the same Idempotency-Key is already in progress."
	MsgConflict       = "Conflict detected with a concurrent request. Please retry with the same Idempotency-Key."
	MsgInternal       = "Internal server error. Please retry the request periodically with the same Idempotency-Key until it succeeds."
)

// MsgKeyTooShort is the message for a new key shorter than min.
func MsgKeyTooShort(min int) string {
	return "Idempotency-Key must be at least " + strconv.Itoa(min) + " characters long."
}

// MsgKeyTooLong is the message for a key longer than max: MaxKeyLength on
// idemd's schema, the column's own limit on another (Store.MaxKeyLength).
func MsgKeyTooLong(max int) string {
	return "Idempotency-Key must be at most " + strconv.Itoa(max) + " characters long."
}

// StatusOf maps the package's errors to HTTP status codes:
// 400 missing/too short/too long/invalid key, 422 same key with different
// parameters, 409 in progress or conflict, a ResponseError's own status, and
// 500 for anything else.
func StatusOf(err error) int {
	var re *ResponseError
	switch {
	case errors.As(err, &re):
		return re.Status
	case errors.Is(err, ErrKeyMissing), errors.Is(err, ErrKeyTooShort),
		errors.Is(err, ErrKeyTooLong), errors.Is(err, ErrKeyInvalid):
		return http.StatusBadRequest
	case errors.Is(err, ErrParamsMismatch):
		return http.StatusUnprocessableEntity
	case errors.Is(err, ErrInProgress), errors.Is(err, ErrConflict), errors.Is(err, ErrLockLost):
		return http.StatusConflict
	}
	return http.StatusInternalServerError
}

// WriteError answers a failed Begin/Execute. Internal errors get a generic
// message: their text may carry SQL or data that is not the client's.
func (s *Store) WriteError(w http.ResponseWriter, err error) {
	var re *ResponseError
	if errors.As(err, &re) {
		writeRaw(w, re.Status, re.Body)
		return
	}
	status := StatusOf(err)
	var msg string
	switch {
	case errors.Is(err, ErrKeyMissing):
		msg = MsgKeyMissing
	case errors.Is(err, ErrKeyTooShort):
		msg = MsgKeyTooShort(s.minKeyLen)
	case errors.Is(err, ErrKeyTooLong):
		max := s.MaxKeyLength()
		if max == 0 {
			max = MaxKeyLength
		}
		msg = MsgKeyTooLong(max)
	case errors.Is(err, ErrKeyInvalid):
		msg = MsgKeyInvalid
	case errors.Is(err, ErrParamsMismatch):
		msg = MsgParamsMismatch
	case errors.Is(err, ErrInProgress):
		msg = MsgInProgress
	case errors.Is(err, ErrConflict), errors.Is(err, ErrLockLost):
		msg = MsgConflict
	default:
		msg = MsgInternal
	}
	WriteJSONError(w, status, msg)
}

// WriteJSONError writes {"error": msg} with status.
func WriteJSONError(w http.ResponseWriter, status int, msg string) {
	b, _ := json.Marshal(map[string]string{"error": msg})
	writeRaw(w, status, b)
}

// WriteOutcome writes a key's final response: the stored status and body
// (see Response for what is stored), whatever the status (a stored 500 is
// replayed as a 500), with Content-Type application/json.
func WriteOutcome(w http.ResponseWriter, out *Outcome) {
	if out.Replayed {
		w.Header().Set(ReplayedHeader, "true")
	}
	writeRaw(w, out.Status, out.Body)
}

func writeRaw(w http.ResponseWriter, status int, body []byte) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(status)
	_, _ = w.Write(body)
}
