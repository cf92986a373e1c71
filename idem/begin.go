package idem

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

// keyColumns is the column list every key read uses. The casts keep a
// database migrated from the article (response_body JSONB) readable.
const keyColumns = `id, created_at, user_id, idempotency_key, last_run_at, locked_at,
	request_method, request_path, request_params::text, request_fingerprint,
	response_code, response_body::text, recovery_point, upstream_idempotency_key`

func scanKey(row pgx.Row) (*Key, error) {
	var (
		k      Key
		params string
		fp     *string
		up     *uuid.UUID
	)
	err := row.Scan(&k.ID, &k.CreatedAt, &k.UserID, &k.IdempotencyKey, &k.LastRunAt, &k.LockedAt,
		&k.RequestMethod, &k.RequestPath, &params, &fp,
		&k.ResponseCode, &k.ResponseBody, &k.RecoveryPoint, &up)
	if err != nil {
		return nil, err
	}
	k.RequestParams = []byte(params)
	if fp != nil {
		k.RequestFingerprint = *fp
	}
	if up != nil {
		k.UpstreamIdempotencyKey = *up
	}
	return &k, nil
}

// beginTimeout bounds Begin, which ignores the request's cancellation.
const beginTimeout = 30 * time.Second

// Begin is the first atomic phase: it inserts the key locked at "started", or
// locks the existing one. A finished key comes back unlocked, for replay.
//
// It fails with ErrKeyMissing, ErrKeyTooShort, ErrKeyTooLong, ErrKeyInvalid,
// ErrParamsMismatch, ErrInProgress, or ErrConflict (after retries).
func (s *Store) Begin(ctx context.Context, req Request) (*Key, error) {
	if err := s.validateKey(ctx, req.Key); err != nil {
		return nil, err
	}
	canon, err := CanonicalParams(req.Params)
	if err != nil {
		return nil, fmt.Errorf("idem: begin: %w", err)
	}
	method := strings.ToUpper(req.Method)
	if len(method) > 10 || utf8.RuneCountInString(req.Path) > 100 {
		// The schema's CHECKs; a programming error of the API, not the client.
		return nil, fmt.Errorf("idem: begin: method or path longer than the schema allows (10/100)")
	}
	fp := Fingerprint(method, req.Path, canon)

	// The statements run on a context the client cannot cancel: a cancel
	// that lands while a claim commits would leave us unsure whether we now
	// hold the lock, and a key locked by nobody is stuck until the lock
	// timeout. Begin is short; the phases that follow do honour ctx.
	dbctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), beginTimeout)
	defer cancel()
	ctx = dbctx

	var key *Key
	if s.isolation == ArticleSerializable {
		err = s.retry(ctx, "begin", func() error {
			return pgx.BeginTxFunc(ctx, s.pool, pgx.TxOptions{IsoLevel: pgx.Serializable}, func(tx pgx.Tx) error {
				key, err = s.beginArticle(ctx, tx, req, method, canon, fp)
				return err
			})
		})
	} else {
		err = s.retry(ctx, "begin", func() error {
			key, err = s.claim(ctx, req, method, canon, fp)
			return err
		})
	}
	if err != nil {
		return nil, err
	}
	return key, nil
}

// maxClaimRounds bounds claim's loop. Each further round means the key
// changed between two of claim's statements (taken, finished, deleted by
// the reaper); that many in a row is a conflict like any other.
const maxClaimRounds = 8

// claim is Begin's protocol: autocommitted statements, each atomic on its
// own, whatever the session's isolation level.
//
//  1. A new key is one INSERT ... ON CONFLICT DO NOTHING on the unique
//     (user_id, idempotency_key) index: of racing requests exactly one gets
//     the row back (the others wait for its insert to commit, then find the
//     key) and holds the key, locked, from the moment it exists.
//  2. An existing key is read as last committed, without a lock, and judged:
//     another request's parameters (422), finished (replay; a finished key
//     never changes), locked by a live request (409, without waiting for
//     the phase that holds its row).
//  3. Otherwise one UPDATE locks it, under the same conditions in its WHERE
//     clause: a concurrent claim, unlock or phase holds the row lock until
//     it commits, and PostgreSQL then re-checks the WHERE clause on the row
//     as committed, so of racing claims exactly one matches. One that does
//     not goes round again and reads what won.
func (s *Store) claim(ctx context.Context, req Request, method string, canon []byte, fp string) (*Key, error) {
	mayCreate := utf8.RuneCountInString(req.Key) >= s.minKeyLen
	for range maxClaimRounds {
		if mayCreate {
			k, err := scanKey(s.pool.QueryRow(ctx, `INSERT INTO idempotency_keys
					(idempotency_key, user_id, locked_at, last_run_at, request_method, request_path,
					 request_params, request_fingerprint, recovery_point, upstream_idempotency_key)
				VALUES ($1, $2, now(), now(), $3, $4, $5, $6, $7, $8)
				ON CONFLICT (user_id, idempotency_key) DO NOTHING
				RETURNING `+keyColumns,
				req.Key, req.UserID, method, req.Path, string(canon), fp, RecoveryPointStarted, uuid.New()))
			if err == nil {
				return k, nil
			}
			if !errors.Is(err, pgx.ErrNoRows) {
				return nil, err
			}
		}
		var locked bool
		k, err := scanKeyWith(s.pool.QueryRow(ctx, `SELECT `+keyColumns+`,
				locked_at IS NOT NULL AND locked_at > now() - make_interval(secs => $3)
			FROM idempotency_keys WHERE user_id = $1 AND idempotency_key = $2`,
			req.UserID, req.Key, s.lockTimeout.Seconds()), &locked)
		switch {
		case errors.Is(err, pgx.ErrNoRows) && !mayCreate:
			return nil, fmt.Errorf("%w: at least %d characters", ErrKeyTooShort, s.minKeyLen)
		case errors.Is(err, pgx.ErrNoRows):
			continue // deleted since the insert found it: insert again
		case err != nil:
			return nil, err
		}
		if !sameRequest(k, method, req.Path, canon, fp) {
			return nil, ErrParamsMismatch
		}
		if k.Finished() {
			return k, nil
		}
		if locked {
			return nil, ErrInProgress
		}
		// Take the lock. A key written by an API predating idemd gets its
		// fingerprint and upstream key now, once.
		k, err = scanKey(s.pool.QueryRow(ctx, `UPDATE idempotency_keys
			SET locked_at = now(), last_run_at = now(),
				request_fingerprint = COALESCE(request_fingerprint, $2),
				upstream_idempotency_key = COALESCE(upstream_idempotency_key, $3)
			WHERE id = $1 AND recovery_point <> $4
				AND (locked_at IS NULL OR locked_at <= now() - make_interval(secs => $5))
			RETURNING `+keyColumns, k.ID, fp, uuid.New(), RecoveryPointFinished, s.lockTimeout.Seconds()))
		if err == nil {
			return k, nil
		}
		if !errors.Is(err, pgx.ErrNoRows) {
			return nil, err
		}
		// Claimed, finished or deleted since the read: read again.
	}
	return nil, fmt.Errorf("%w (begin: the key changed under %d claims in a row)", ErrConflict, maxClaimRounds)
}

// beginArticle is the article's Begin, kept as the anchor of the isolation
// measurement (isolation_test.go): in one SERIALIZABLE transaction, look
// the key up and insert it when absent. The look-up's predicate lock on the
// unique index's page makes requests with different keys of one user
// conflict.
func (s *Store) beginArticle(ctx context.Context, tx pgx.Tx, req Request, method string, canon []byte, fp string) (*Key, error) {
	var locked bool
	row := tx.QueryRow(ctx, `SELECT `+keyColumns+`,
			locked_at IS NOT NULL AND locked_at > now() - make_interval(secs => $3)
		FROM idempotency_keys WHERE user_id = $1 AND idempotency_key = $2`,
		req.UserID, req.Key, s.lockTimeout.Seconds())
	k, err := scanKeyWith(row, &locked)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		if utf8.RuneCountInString(req.Key) < s.minKeyLen {
			return nil, fmt.Errorf("%w: at least %d characters", ErrKeyTooShort, s.minKeyLen)
		}
		return scanKey(tx.QueryRow(ctx, `INSERT INTO idempotency_keys
				(idempotency_key, user_id, locked_at, last_run_at, request_method, request_path,
				 request_params, request_fingerprint, recovery_point, upstream_idempotency_key)
			VALUES ($1, $2, now(), now(), $3, $4, $5, $6, $7, $8)
			RETURNING `+keyColumns,
			req.Key, req.UserID, method, req.Path, string(canon), fp, RecoveryPointStarted, uuid.New()))
	case err != nil:
		return nil, err
	}
	if !sameRequest(k, method, req.Path, canon, fp) {
		return nil, ErrParamsMismatch
	}
	if locked {
		return nil, ErrInProgress
	}
	if k.Finished() {
		return k, nil
	}
	return scanKey(tx.QueryRow(ctx, `UPDATE idempotency_keys
		SET locked_at = now(), last_run_at = now(),
			request_fingerprint = COALESCE(request_fingerprint, $2),
			upstream_idempotency_key = COALESCE(upstream_idempotency_key, $3)
		WHERE id = $1
		RETURNING `+keyColumns, k.ID, fp, uuid.New()))
}

func scanKeyWith(row pgx.Row, locked *bool) (*Key, error) {
	return scanKey(extraScan{row: row, extra: locked})
}

// extraScan appends one destination to a key scan.
type extraScan struct {
	row   pgx.Row
	extra any
}

func (e extraScan) Scan(dest ...any) error { return e.row.Scan(append(dest, e.extra)...) }

// sameRequest compares a stored key with the incoming request. Keys without
// a fingerprint (written by an API predating idemd, or by hand) are compared
// on method, path and canonical params instead.
func sameRequest(k *Key, method, path string, canon []byte, fp string) bool {
	if k.RequestFingerprint != "" {
		return k.RequestFingerprint == fp
	}
	if !strings.EqualFold(k.RequestMethod, method) || k.RequestPath != path {
		return false
	}
	stored, err := CanonicalJSON(k.RequestParams)
	return err == nil && string(stored) == string(canon)
}
