package idem

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemd/idemd/idem/replayauth"
)

// Defaults of ReplayNoncesOptions.
const (
	// DefaultReplayNonceCleanupInterval is how often an API process deletes
	// expired nonces while the batches it deletes are not full.
	DefaultReplayNonceCleanupInterval = time.Minute
	// DefaultReplayNonceCleanupBatch bounds the rows one cleanup statement
	// deletes.
	DefaultReplayNonceCleanupBatch = 1000
	// DefaultReplayNonceGrace is how long past its expiry a nonce is kept:
	// a replica whose clock runs behind the database's by less than this
	// still refuses it at the very end of its window.
	DefaultReplayNonceGrace = time.Minute
)

// ReplayNoncesOptions tune ReplayNonces. The zero value is usable.
type ReplayNoncesOptions struct {
	// CleanupInterval between cleanups (DefaultReplayNonceCleanupInterval
	// when zero). A cleanup that deleted a full batch is followed by
	// another on the next Use, so deletion keeps up with any rate.
	CleanupInterval time.Duration
	// CleanupBatch bounds the rows one cleanup deletes
	// (DefaultReplayNonceCleanupBatch when zero).
	CleanupBatch int
	// Grace past expires_at before a row may be deleted
	// (DefaultReplayNonceGrace when zero). Ages use the database clock.
	Grace time.Duration
	// Logger receives cleanup failures, once per outage, and the recovery.
	Logger *slog.Logger
}

// ReplayNonces is a replayauth.NonceStore in PostgreSQL (the
// idemd_replay_nonces table of migrations/00014), shared by every API
// replica on the database: a nonce accepted by one is refused by all.
//
// Use records a nonce with one atomic INSERT ... ON CONFLICT (nonce) DO
// NOTHING, so of any number of concurrent uses of one nonce, on any
// replicas, exactly one is fresh. Rows are removed by their own expiry:
// after a Use, at most once per CleanupInterval, the process deletes up to
// CleanupBatch rows expired for longer than Grace (by the database clock),
// and again on the next Use while batches come back full. Nothing counts
// rows: the table holds about rate × (window + Grace + CleanupInterval)
// rows and never refuses a fresh nonce.
//
// A database error fails closed: Use returns it, and the verifier refuses
// the request (replayauth.ErrNonceStore; ReplayAuth answers 503, which the
// completer retries). A failed cleanup does not fail the request: it is
// counted, logged once per outage and retried at the next interval.
//
// The API's role needs SELECT, INSERT, DELETE on idemd_replay_nonces
// (deploy/sql/roles.sql grants them to idemd_api).
type ReplayNonces struct {
	pool     *pgxpool.Pool
	interval time.Duration
	batch    int
	grace    time.Duration
	now      func() time.Time
	logger   *slog.Logger

	mu        sync.Mutex
	nextClean time.Time
	cleaning  atomic.Bool

	useErrors     atomic.Uint64
	cleanupErrors atomic.Uint64
	deleted       atomic.Uint64
	cleanupDown   outage
}

var _ replayauth.NonceStore = (*ReplayNonces)(nil)

// NewReplayNonces returns the store on pool.
func NewReplayNonces(pool *pgxpool.Pool, opts ReplayNoncesOptions) *ReplayNonces {
	n := &ReplayNonces{pool: pool, interval: opts.CleanupInterval, batch: opts.CleanupBatch, grace: opts.Grace, now: time.Now, logger: opts.Logger}
	if n.interval <= 0 {
		n.interval = DefaultReplayNonceCleanupInterval
	}
	if n.batch <= 0 {
		n.batch = DefaultReplayNonceCleanupBatch
	}
	if n.grace <= 0 {
		n.grace = DefaultReplayNonceGrace
	}
	if n.logger == nil {
		n.logger = slog.New(slog.DiscardHandler)
	}
	return n
}

// Use implements replayauth.NonceStore.
func (n *ReplayNonces) Use(ctx context.Context, nonce string, expires time.Time) (bool, error) {
	tag, err := n.pool.Exec(ctx, `INSERT INTO idemd_replay_nonces (nonce, expires_at) VALUES ($1, $2)
		ON CONFLICT (nonce) DO NOTHING`, nonce, expires)
	if err != nil {
		n.useErrors.Add(1)
		return false, fmt.Errorf("idem: record replay nonce: %w", err)
	}
	n.maybeCleanup(ctx)
	return tag.RowsAffected() == 1, nil
}

// maybeCleanup runs one cleanup when it is due and no other goroutine of
// this process is running one.
func (n *ReplayNonces) maybeCleanup(ctx context.Context) {
	now := n.now()
	n.mu.Lock()
	due := !now.Before(n.nextClean)
	n.mu.Unlock()
	if !due || !n.cleaning.CompareAndSwap(false, true) {
		return
	}
	defer n.cleaning.Store(false)
	deleted, err := n.Cleanup(ctx)
	next := now.Add(n.interval)
	if err == nil && deleted >= int64(n.batch) {
		next = now // more to delete: again on the next Use
	}
	n.mu.Lock()
	n.nextClean = next
	n.mu.Unlock()
}

// Cleanup deletes up to CleanupBatch rows expired for longer than Grace
// and returns how many it deleted. Use calls it when due; it is exported
// for tests and for an operator's one-off purge.
func (n *ReplayNonces) Cleanup(ctx context.Context) (int64, error) {
	// ctid = ANY(ARRAY(...)): the batch is found through the expires_at
	// index and deleted by a TID scan, never a scan of the table. Two
	// processes cleaning at once at worst wait for each other's rows.
	tag, err := n.pool.Exec(ctx, `DELETE FROM idemd_replay_nonces WHERE ctid = ANY (ARRAY(
		SELECT ctid FROM idemd_replay_nonces
		WHERE expires_at < now() - make_interval(secs => $1)
		ORDER BY expires_at LIMIT $2))`, n.grace.Seconds(), n.batch)
	if err != nil {
		if ctx.Err() == nil {
			n.cleanupErrors.Add(1)
			n.cleanupDown.fail(n.logger, "idem: deleting expired replay nonces failed; retrying every cleanup interval", err)
		}
		return 0, fmt.Errorf("idem: delete expired replay nonces: %w", err)
	}
	n.cleanupDown.ok(n.logger, "idem: deleting expired replay nonces works again")
	n.deleted.Add(uint64(tag.RowsAffected()))
	return tag.RowsAffected(), nil
}

// ReplayNonceStats are a ReplayNonces' counters since it was created.
type ReplayNonceStats struct {
	UseErrors     uint64 // nonces that could not be recorded (requests refused)
	CleanupErrors uint64 // failed cleanups
	Deleted       uint64 // expired rows deleted
}

// Stats returns the store's counters, for metrics.
func (n *ReplayNonces) Stats() ReplayNonceStats {
	return ReplayNonceStats{UseErrors: n.useErrors.Load(), CleanupErrors: n.cleanupErrors.Load(), Deleted: n.deleted.Load()}
}

// outage logs the first failure of a run of failures and the first success
// after it, so an outage is one log line (and one recovery line), not one
// per request.
type outage struct {
	down   atomic.Bool
	failed atomic.Uint64
}

func (o *outage) fail(l *slog.Logger, msg string, err error) {
	o.failed.Add(1)
	if o.down.CompareAndSwap(false, true) {
		l.Error(msg, "error", err.Error())
	}
}

func (o *outage) ok(l *slog.Logger, msg string) {
	if o.down.CompareAndSwap(true, false) {
		l.Info(msg, "failures", o.failed.Swap(0))
	}
}

// isCanceled tells a request whose client went away from a database outage.
func isCanceled(ctx context.Context, err error) bool {
	return ctx.Err() != nil && (errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded))
}
