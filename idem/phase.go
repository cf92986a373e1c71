package idem

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemd/idemd/internal/backoff"
)

// Result is what a phase returns: NoOp, RecoveryPoint or Response.
type Result interface {
	apply(ctx context.Context, tx pgx.Tx, k *Key) error
}

type noOp struct{}

// NoOp leaves the key where it is.
func NoOp() Result { return noOp{} }

func (noOp) apply(ctx context.Context, tx pgx.Tx, k *Key) error {
	// Still confirm the lock inside the transaction. The phase's key lock
	// has already checked it; under the article's protocol (no key lock)
	// this read is what makes a concurrent takeover of the key conflict
	// with us.
	var held bool
	if err := tx.QueryRow(ctx, `SELECT locked_at IS NOT DISTINCT FROM $2 FROM idempotency_keys WHERE id = $1`, k.ID, k.LockedAt).Scan(&held); err != nil {
		return err
	}
	if !held {
		return ErrLockLost
	}
	return nil
}

type recoveryPoint string

// RecoveryPoint moves the key to the named point when the phase commits.
func RecoveryPoint(name string) Result { return recoveryPoint(name) }

func (p recoveryPoint) apply(ctx context.Context, tx pgx.Tx, k *Key) error {
	if p == RecoveryPointFinished {
		return errors.New("recovery point finished is set by returning a Response")
	}
	tag, err := tx.Exec(ctx, `UPDATE idempotency_keys SET recovery_point = $3
		WHERE id = $1 AND locked_at IS NOT DISTINCT FROM $2`, k.ID, k.LockedAt, string(p))
	if err != nil {
		return err
	}
	if tag.RowsAffected() != 1 {
		return ErrLockLost
	}
	k.RecoveryPoint = string(p)
	return nil
}

// ResponseError is an error a phase returns to answer the client without
// finishing the key: the key is unlocked and stays at its recovery point, so
// a retry continues from there (e.g. 503 while an upstream is down).
type ResponseError struct {
	Status int
	Body   []byte
	Err    error // the cause, for logs; may be nil
}

func (e *ResponseError) Error() string {
	if e.Err != nil {
		return fmt.Sprintf("idem: response %d: %v", e.Status, e.Err)
	}
	return fmt.Sprintf("idem: response %d", e.Status)
}

func (e *ResponseError) Unwrap() error { return e.Err }

// PhaseFunc is the body of an atomic phase. It may be run more than once
// (serialization failures and deadlocks are retried), so it must do nothing
// outside tx that is not itself idempotent: upstream calls carry
// k.UpstreamIdempotencyKey.
//
// It runs at the store's Isolation with the key row locked. Under
// ReadCommitted every statement sees the data committed when it starts:
// rows of the API's own that the phase reads and then writes based on what
// it read must be locked by the phase (SELECT ... FOR UPDATE) or changed in
// one statement (UPDATE ... SET n = n - 1 WHERE n > 0); rows that belong to
// this key alone are already safe behind the key's lock.
type PhaseFunc func(ctx context.Context, tx pgx.Tx, k *Key) (Result, error)

// Phase runs fn and applies its result in one transaction at the store's
// Isolation. The transaction first locks the key row (SELECT ... FOR
// UPDATE) and checks that this request still holds the key at the recovery
// point it is at: two requests that got hold of one key (a lock taken over
// after LockTimeout) can never run phases at the same time, and the one
// that lost the key stops with ErrLockLost before fn runs. Serialization
// failures and deadlocks are retried. On any failure the key is unlocked
// before the error is returned (ErrConflict when retries ran out).
func (s *Store) Phase(ctx context.Context, k *Key, fn PhaseFunc) error {
	before := *k
	err := s.retry(ctx, "phase "+k.RecoveryPoint, func() error {
		return pgx.BeginTxFunc(ctx, s.pool, pgx.TxOptions{IsoLevel: s.isolation.txIsoLevel()}, func(tx pgx.Tx) error {
			*k = before // a retried attempt starts from the same key state
			if s.isolation != ArticleSerializable {
				if err := lockKey(ctx, tx, k); err != nil {
					return err
				}
			}
			res, err := fn(ctx, tx, k)
			if err != nil {
				return err
			}
			if res == nil {
				return errors.New("phase returned no result")
			}
			return s.apply(ctx, tx, k, res) // response.go: a Response gets the store's schema
		})
	})
	if err != nil {
		*k = before
		s.Unlock(ctx, k)
		return err
	}
	return nil
}

// lockKey locks the key's row for the rest of the phase's transaction and
// checks this request still holds the key (its locked_at is ours) at the
// recovery point it expects. Until the transaction ends, nothing else can
// take the key over, unlock, move or finish it: those are all UPDATEs of
// this row, and they wait.
func lockKey(ctx context.Context, tx pgx.Tx, k *Key) error {
	var held bool
	err := tx.QueryRow(ctx, `SELECT locked_at IS NOT DISTINCT FROM $2 AND recovery_point = $3
		FROM idempotency_keys WHERE id = $1 FOR UPDATE`, k.ID, k.LockedAt, k.RecoveryPoint).Scan(&held)
	if errors.Is(err, pgx.ErrNoRows) {
		return ErrLockLost // deleted: nobody holds it any more
	}
	if err != nil {
		return err
	}
	if !held {
		return ErrLockLost
	}
	return nil
}

// Unlock releases this request's lock on k, if it still holds it, so the
// next retry need not wait for the lock timeout. It runs even when ctx is
// cancelled (the client went away), and only logs failure: the lock timeout
// is the backstop.
func (s *Store) Unlock(ctx context.Context, k *Key) {
	if k == nil || k.LockedAt == nil {
		return
	}
	uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if _, err := s.pool.Exec(uctx, `UPDATE idempotency_keys SET locked_at = NULL
		WHERE id = $1 AND locked_at = $2`, k.ID, *k.LockedAt); err != nil {
		s.logger.Warn("idem: unlock failed; the key stays locked until the lock timeout",
			"key_id", k.ID, "error", err)
		return
	}
	k.LockedAt = nil
}

// keyUniqueIndex is the article's unique index on (user_id, idempotency_key).
const keyUniqueIndex = "idempotency_keys_user_id_idempotency_key"

// retry runs fn, re-running it on serialization failures, deadlocks and
// unique violations of the key index (two requests inserting one key
// under the article's protocol) up to the configured retries, then
// ErrConflict. fn runs its own transaction (a phase) or autocommitted
// statements (Begin's claim).
func (s *Store) retry(ctx context.Context, op string, fn func() error) error {
	for attempt := 0; ; attempt++ {
		err := fn()
		if err == nil {
			return nil
		}
		if !retryable(err) {
			if isProtocolErr(err) {
				return err
			}
			return fmt.Errorf("idem: %s: %w", op, err)
		}
		if attempt >= s.retries {
			return fmt.Errorf("%w (%s, %d attempts): %v", ErrConflict, op, attempt+1, err)
		}
		// Exponential backoff with full jitter (2, 4, 8... ms caps, at most
		// 100 ms), so the transactions that conflicted do not collide
		// again in lockstep.
		d := backoff.Delay(attempt+1, 2*time.Millisecond, 100*time.Millisecond, nil)
		select {
		case <-ctx.Done():
			return fmt.Errorf("idem: %s: %w", op, ctx.Err())
		case <-time.After(d):
		}
	}
}

func retryable(err error) bool {
	var pg *pgconn.PgError
	if !errors.As(err, &pg) {
		return false
	}
	switch pg.Code {
	case "40001", "40P01":
		return true
	case "23505":
		// Only our own unique index: a concurrent insert of the same key,
		// which the retry then sees as in progress. An API's own unique
		// violations are bugs to report, not conflicts to retry.
		return pg.ConstraintName == keyUniqueIndex
	}
	return false
}

// isProtocolErr reports errors that are already the package's own sentinel
// or a phase's response, which callers match with errors.Is/As unwrapped.
func isProtocolErr(err error) bool {
	var re *ResponseError
	return errors.As(err, &re) || errors.Is(err, ErrKeyTooShort) || errors.Is(err, ErrParamsMismatch) ||
		errors.Is(err, ErrInProgress) || errors.Is(err, ErrLockLost) || errors.Is(err, ErrConflict)
}
