// Package lease keeps one idemd task from running in two processes at once,
// through any connection path: a direct connection, a session-mode pooler or
// a transaction-mode pooler.
//
// A lease is a row in idemd_leases (name, holder, expires_at). It is taken
// when free or expired, and every transaction it guards locks its row:
// Renew renews it and takes the exclusive lock (one guarded transaction at
// a time), Fence takes the share lock (several at once, renewed between
// them). Either way a takeover waits for the guarded transactions to end
// and then finds the expiry last renewed. It is deleted when the task ends. A
// holder that dies leaves a lease that expires by itself within its TTL.
//
// It replaces session advisory locks, which belong to one server
// connection: behind a transaction-mode pooler the unlock runs on whichever
// server connection the pooler hands out, returns false, and leaves the
// lock held by nobody until the pooler recycles that connection.
package lease

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// DB is what Renew and Release run on: a pool, a connection or a
// transaction.
type DB interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// ErrLost: the lease is no longer this holder's (it expired and another
// holder took it, or it was released). The transaction that found out must
// roll back.
var ErrLost = errors.New("lease lost")

// Holder names the process taking leases: host, pid and a random suffix,
// so two processes never share a name and an operator can tell who holds a
// lease from the row alone.
func Holder(component string) string {
	host, err := os.Hostname()
	if err != nil {
		host = "unknown-host"
	}
	var b [4]byte
	_, _ = rand.Read(b[:])
	return fmt.Sprintf("%s/%s/%d/%s", component, host, os.Getpid(), hex.EncodeToString(b[:]))
}

// Attempt is the outcome of one try to take a lease.
type Attempt struct {
	Acquired bool
	// Busy: the lease row is locked by a transaction its holder guards, so
	// the holder is alive and working. Nothing else is known.
	Busy bool
	// The lease as it was before this attempt (Holder empty: there was
	// none). When Acquired with a previous holder other than ours, an
	// expired lease was taken over: its holder died without releasing it.
	PrevHolder  string
	PrevRenewed time.Time
	PrevExpires time.Time
}

// TookOver reports whether the attempt took a lease another holder had
// left to expire.
func (a Attempt) TookOver(holder string) bool {
	return a.Acquired && a.PrevHolder != "" && a.PrevHolder != holder
}

// acquireSQL reads the lease as it was and takes it in one statement: the
// upsert only replaces an expired lease (or one this holder already has),
// re-checked on the newest row version after any lock wait, so two takers
// can never both succeed.
const acquireSQL = `
WITH prev AS (
    SELECT holder, renewed_at, expires_at
    FROM idemd_leases WHERE name = @name
), took AS (
    INSERT INTO idemd_leases AS l (name, holder, acquired_at, renewed_at, expires_at)
    VALUES (@name, @holder, clock_timestamp(), clock_timestamp(), clock_timestamp() + @ttl::interval)
    ON CONFLICT (name) DO UPDATE
        SET holder = excluded.holder, acquired_at = excluded.acquired_at,
            renewed_at = excluded.renewed_at, expires_at = excluded.expires_at
        WHERE l.expires_at < clock_timestamp() OR l.holder = excluded.holder
    RETURNING 1
)
SELECT EXISTS (SELECT FROM took), prev.holder, prev.renewed_at, prev.expires_at
FROM (SELECT) AS one LEFT JOIN prev ON true`

// Beginner starts transactions: a pool or a connection.
type Beginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// busyLockTimeout is how long Acquire waits for the lease row's lock. The
// row is locked for longer only by a transaction the holder guards with
// Renew, which proves the holder alive: a dead client's transaction is
// rolled back by the server.
const busyLockTimeout = 200 * time.Millisecond

// Acquire tries once to take the lease name for holder, for ttl.
func Acquire(ctx context.Context, db Beginner, name, holder string, ttl time.Duration) (Attempt, error) {
	var a Attempt
	var prevHolder *string
	var prevRenewed, prevExpires *time.Time
	err := pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "SELECT set_config('lock_timeout', $1, true)", fmt.Sprint(busyLockTimeout.Milliseconds())); err != nil {
			return err
		}
		return tx.QueryRow(ctx, acquireSQL, pgx.NamedArgs{"name": name, "holder": holder, "ttl": ttl}).
			Scan(&a.Acquired, &prevHolder, &prevRenewed, &prevExpires)
	})
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == pgerrcode.LockNotAvailable {
		return Attempt{Busy: true}, nil
	}
	if err != nil {
		return a, fmt.Errorf("lease %s: acquire: %w", name, err)
	}
	if prevHolder != nil {
		a.PrevHolder, a.PrevRenewed, a.PrevExpires = *prevHolder, *prevRenewed, *prevExpires
	}
	return a, nil
}

// renewSQL extends the lease and takes its row lock for the rest of the
// transaction it runs in.
const renewSQL = `
UPDATE idemd_leases SET renewed_at = clock_timestamp(), expires_at = clock_timestamp() + @ttl::interval
WHERE name = @name AND holder = @holder`

// Renew extends holder's lease by ttl. Run inside a transaction, it fences
// that transaction: the lease row stays locked until it ends, so nobody can
// take the lease while the guarded work is uncommitted. ErrLost when the
// lease is no longer holder's.
func Renew(ctx context.Context, db DB, name, holder string, ttl time.Duration) error {
	tag, err := db.Exec(ctx, renewSQL, pgx.NamedArgs{"name": name, "holder": holder, "ttl": ttl})
	if err != nil {
		return fmt.Errorf("lease %s: renew: %w", name, err)
	}
	if tag.RowsAffected() != 1 {
		return fmt.Errorf("lease %s held by %s: %w", name, holder, ErrLost)
	}
	return nil
}

// fenceSQL takes the lease row's share lock for the rest of the
// transaction it runs in, if the lease is still holder's.
const fenceSQL = `SELECT 1 FROM idemd_leases WHERE name = @name AND holder = @holder FOR SHARE`

// Fence guards the transaction it runs in like Renew, without renewing:
// the row's share lock keeps a taker out until the transaction ends (a
// taker's upsert needs the row's exclusive lock), but, unlike Renew's
// exclusive lock, it does not exclude the holder's other fenced
// transactions, so a holder can run several guarded transactions at once.
// The holder renews between them (a Renew waits for every fence to end).
// ErrLost when the lease is no longer holder's.
func Fence(ctx context.Context, tx pgx.Tx, name, holder string) error {
	// A SELECT's command tag counts its rows.
	tag, err := tx.Exec(ctx, fenceSQL, pgx.NamedArgs{"name": name, "holder": holder})
	if err != nil {
		return fmt.Errorf("lease %s: fence: %w", name, err)
	}
	if tag.RowsAffected() != 1 {
		return fmt.Errorf("lease %s held by %s: %w", name, holder, ErrLost)
	}
	return nil
}

// Release deletes holder's lease; a lease that is no longer holder's is
// left alone. It reports whether there was one to delete.
func Release(ctx context.Context, db DB, name, holder string) (bool, error) {
	tag, err := db.Exec(ctx, `DELETE FROM idemd_leases WHERE name = @name AND holder = @holder`,
		pgx.NamedArgs{"name": name, "holder": holder})
	if err != nil {
		return false, fmt.Errorf("lease %s: release: %w", name, err)
	}
	return tag.RowsAffected() == 1, nil
}
