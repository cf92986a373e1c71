package idem

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"
)

type response struct {
	status int
	body   []byte
	// schema is the store's, set by Store.apply before the response is
	// applied; nil means idemd's schema (text).
	schema *schema
}

// Response finishes the key with a final status and body. The stored body
// is what the client gets, on this request and on every later one with the
// same key:
//
//   - on idemd's schema (response_body TEXT) it is body, byte for byte;
//   - on the article's (response_body JSONB) it is PostgreSQL's text of the
//     JSONB value (keys reordered, whitespace normalised, see
//     docs/api-authors.md), and a body that is not JSON is stored as a
//     JSON string of its text. This first response already carries that
//     text, so it never differs from a replay.
//
// A body that is not UTF-8 without NUL bytes fails the phase with
// ErrResponseBody.
func Response(status int, body []byte) Result { return response{status: status, body: body} }

// apply applies a phase's result, giving a Response the store's schema.
func (s *Store) apply(ctx context.Context, tx pgx.Tx, k *Key, res Result) error {
	if r, ok := res.(response); ok {
		sc, err := s.schemaFor(ctx)
		if err != nil {
			return err
		}
		r.schema = sc
		res = r
	}
	return res.apply(ctx, tx, k)
}

func (r response) apply(ctx context.Context, tx pgx.Tx, k *Key) error {
	sc := r.schema
	if sc == nil {
		sc = &schema{body: bodyText, maxKey: MaxKeyLength}
	}
	body, err := storableBody(sc, r.body)
	if err != nil {
		return err
	}
	// On a JSON column the value goes in through an explicit cast from
	// text, and the stored value's text comes back: that is what this
	// request answers, byte for byte what every replay will answer.
	set, ret := `$5`, ``
	if sc.jsonBody() {
		set, ret = `$5::text::`+sc.body, ` RETURNING response_body::text`
	}
	q := `UPDATE idempotency_keys
		SET locked_at = NULL, recovery_point = $3, response_code = $4, response_body = ` + set + `
		WHERE id = $1 AND locked_at IS NOT DISTINCT FROM $2` + ret
	args := []any{k.ID, k.LockedAt, RecoveryPointFinished, r.status, body}
	if ret == "" {
		tag, err := tx.Exec(ctx, q, args...)
		if err != nil {
			return err
		}
		if tag.RowsAffected() != 1 {
			return ErrLockLost
		}
	} else {
		var stored *string
		err := tx.QueryRow(ctx, q, args...).Scan(&stored)
		if errors.Is(err, pgx.ErrNoRows) {
			return ErrLockLost
		}
		if err != nil {
			return err
		}
		body = stored
	}
	k.RecoveryPoint = RecoveryPointFinished
	k.LockedAt = nil
	k.ResponseCode = &r.status
	k.ResponseBody = body
	return nil
}
