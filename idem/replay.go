package idem

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"

	"github.com/idemd/idemd/idem/replayauth"
)

// MaxReplayBody bounds the body ReplayAuth reads to verify its digest.
const MaxReplayBody = 1 << 20

// MsgReplayUnauthorized is the body of every ReplayAuth rejection. One
// message for all causes, so a prober learns nothing about which keys exist.
const MsgReplayUnauthorized = "Replay signature rejected."

type replayUserKey struct{}

// ReplayUserID returns the user a request was authenticated as by
// ReplayAuth. An API's own authentication checks it first and, when set,
// treats the request exactly as one from that user.
//
// Only ReplayAuth can set it, after verifying a signature: the context key
// is unexported, so no other code in the API can forge a replay-
// authenticated request. A test of an API's replay path signs a request
// with a replayauth.Signer and sends it through ReplayAuth.
func ReplayUserID(ctx context.Context) (int64, bool) {
	id, ok := ctx.Value(replayUserKey{}).(int64)
	return id, ok
}

// ReplayAuth returns middleware for idemd's completer. A request without the
// replayauth.Header passes through untouched, to the API's own
// authentication. A request with it is accepted only if
//
//   - the signature verifies (HMAC, skew window, fresh nonce) over the
//     method, path, Idempotency-Key header and body, and
//   - that user has an existing, unfinished key with that value, stored for
//     this same method and path;
//
// otherwise it gets 401. An accepted request carries the signed user id (see
// ReplayUserID). With a nil verifier the replay path is disabled: every
// signed request gets 401.
//
// Nonces are recorded in the store's database (ReplayNonces, table
// idemd_replay_nonces), shared by every replica of the API, unless v was
// given a store of its own with WithNonceStore. When the nonce cannot be
// recorded (the database is unreachable) the request is refused with 503,
// which the completer retries, and the outage is logged once, not once per
// request, with a line when it is over.
func (s *Store) ReplayAuth(v *replayauth.Verifier) func(http.Handler) http.Handler {
	if v != nil && v.NonceStore() == nil {
		v = v.WithNonceStore(s.replayNonces)
	}
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			header := r.Header.Get(replayauth.Header)
			if header == "" {
				next.ServeHTTP(w, r)
				return
			}
			userID, err := s.verifyReplay(r, v, header)
			if errors.Is(err, replayauth.ErrNonceStore) {
				// Fail closed, with a status the completer retries.
				if !isCanceled(r.Context(), err) {
					s.nonceDown.fail(s.logger, "idem: cannot record replay nonces; signed replays are refused with 503 until it answers again", err)
				}
				WriteJSONError(w, http.StatusServiceUnavailable, MsgInternal)
				return
			}
			var dbErr *replayLookupError
			if errors.As(err, &dbErr) {
				// Our failure, not the caller's: 5xx, which the completer
				// retries later, rather than a 401 it would give up on.
				s.logger.Error("idem: replay key lookup failed", "error", dbErr.err.Error())
				WriteJSONError(w, http.StatusServiceUnavailable, MsgInternal)
				return
			}
			if err != nil {
				// The reason goes to logs, never to the caller.
				s.logger.Warn("idem: replay signature rejected", "path", r.URL.Path, "reason", err.Error())
				WriteJSONError(w, http.StatusUnauthorized, MsgReplayUnauthorized)
				return
			}
			next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), replayUserKey{}, userID)))
		})
	}
}

var (
	errReplayDisabled = errors.New("replay path disabled: no verifier configured")
	errReplayNoKey    = errors.New("no unfinished key of the signed user for this method and path")
	errReplayBody     = errors.New("body too large or unreadable")
)

func (s *Store) verifyReplay(r *http.Request, v *replayauth.Verifier, header string) (int64, error) {
	if v == nil {
		return 0, errReplayDisabled
	}
	key := r.Header.Get(replayauth.IdempotencyKeyHeader)
	if err := ValidateKey(key); err != nil {
		return 0, err
	}
	if _, err := s.schemaFor(r.Context()); err != nil {
		return 0, &replayLookupError{err: err}
	}
	if err := s.validateKey(r.Context(), key); err != nil {
		return 0, err
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, MaxReplayBody+1))
	if err != nil || len(body) > MaxReplayBody {
		return 0, errReplayBody
	}
	_ = r.Body.Close()
	// The handler reads the same bytes the signature covered.
	r.Body = io.NopCloser(bytes.NewReader(body))
	userID, err := v.Verify(r.Context(), header, replayauth.Request{
		Method:         r.Method,
		Path:           r.URL.Path,
		IdempotencyKey: key,
		Body:           body,
	})
	if err == nil || errors.Is(err, replayauth.ErrReplayed) {
		// The nonce store answered.
		s.nonceDown.ok(s.logger, "idem: recording replay nonces works again")
	}
	if err != nil {
		return 0, err
	}
	var ok bool
	err = s.pool.QueryRow(r.Context(), `SELECT EXISTS (
			SELECT 1 FROM idempotency_keys
			WHERE user_id = $1 AND idempotency_key = $2
			  AND recovery_point <> $3
			  AND upper(request_method) = upper($4) AND request_path = $5)`,
		userID, key, RecoveryPointFinished, r.Method, r.URL.Path).Scan(&ok)
	if err != nil {
		return 0, &replayLookupError{err: err}
	}
	if !ok {
		return 0, errReplayNoKey
	}
	return userID, nil
}

type replayLookupError struct{ err error }

func (e *replayLookupError) Error() string { return "idem: replay key lookup: " + e.err.Error() }
