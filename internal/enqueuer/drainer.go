package enqueuer

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"

	"github.com/idemd/idemd/internal/lifecycle"
)

// One replica listens and drains; the others stand by.
//
// Every listening replica hears every notification: each commit woke
// every replica's listener backend and process, and each replica ran a
// move transaction for it, all but one finding nothing left to take. Two
// replicas answered 0.72× the requests of the API inserting into River
// itself where one replica answered 0.98× (docs/benchmarks/load.md). So
// exactly one replica, the drainer, listens and drains when notified; the
// others stand by, not listening, and sweep every --sweep-interval as
// before (moving whatever the drainer leaves, as a poll-only replica
// would).
//
// The drainer is the replica whose listener connection holds a session
// advisory lock. A listener connects, LISTENs and proves with its first
// self-check that the session hears what is committed through the pool
// (LISTEN through a transaction-mode pooler is deaf, and a session lock
// there would stay with a pooled server connection); then it takes the
// lock, or UNLISTENs and stands by, trying for the lock every
// --takeover-interval with pg_try_advisory_lock, which returns at once.
// The lock is free again the moment the drainer's session ends: the
// drainer stopped, was killed (the kernel closes its sockets), or lost its
// connection, or its self-check failed (which ends the connection). The
// standby's next attempt takes it; it then LISTENs again and, its snapshot
// taken after LISTEN, runs a full pass for whatever was committed
// meanwhile, including the rows of a batch the old drainer died holding.
//
// Why attempts and not a wait in pg_advisory_lock, which would return the
// instant the lock is free: a statement that waits holds the snapshot it
// started with, and the server's xmin horizon cannot pass a snapshot's
// xmin. A standby waiting in pg_advisory_lock for as long as the drainer
// lived kept vacuum from removing a single dead row in the whole database,
// the API's tables too (an anti-wraparound vacuum cannot advance
// relfrozenxid past it either). No session of the enqueuer may wait inside
// a statement; an attempt holds its snapshot for the microseconds it runs.
// Nothing the server offers wakes a session without a statement when
// another session ends (a killed drainer sends no NOTIFY), so a takeover
// costs up to one interval more than the old wait did
// (docs/benchmarks/enqueuer.md, "Takeover").
//
// Why a session lock on the listener's connection and not a lease row
// (internal/lease, the reaper's): a lease changes hands only after its
// TTL, a lock the instant its session ends; LISTEN already needs this
// session connection, so the lock needs nothing more; and holding both on
// one session means the drainer is always a replica that hears
// notifications. No drainer while replicas stand by (the lock held by a
// session no running replica owns) is the degraded mode: jobs then move
// only by the sweep, within --sweep-interval, and IdemdEnqueuerNoDrainer
// fires.

// drainerTryLockSQL takes the drainer lock if it is free and returns at
// once either way. The key is per schema (current_schema(): the search_path
// of the installation), since advisory locks are per database and one
// database may hold several installations.
const drainerTryLockSQL = `SELECT pg_try_advisory_lock(hashtextextended('idemd enqueuer drainer ' || current_schema(), 0))`

// drainerSessionSQL sets up the listener's session. No server timeout may
// end the drainer's idle listening (a role's or database's
// idle_session_timeout; statement_timeout and lock_timeout are turned off
// too, since no statement of this session may be cut short by the API's
// own settings), and the server is to notice a client that vanished
// without closing its socket (a partitioned node) within about half a
// minute, through keepalives while the session idles and the connection
// check while a statement runs, so the lock does not outlive its replica.
const drainerSessionSQL = `SET statement_timeout = 0; SET lock_timeout = 0; SET idle_session_timeout = 0;
SET tcp_keepalives_idle = 10; SET tcp_keepalives_interval = 5; SET tcp_keepalives_count = 3;
SET client_connection_check_interval = '5s'`

// elect takes the drainer lock on the listener's connection conn, or
// stands by until it can, and returns the cause of the full pass the new
// drainer runs: wakeReconnect when the lock was free (the listener just
// connected), wakeDrainer when it took over from a drainer that went away.
// A standby does not listen while it waits, and holds no snapshot between
// its attempts.
func (s *Service) elect(ctx context.Context, conn *pgx.Conn) (cause string, err error) {
	got, err := s.tryDrainerLock(ctx, conn)
	if err != nil {
		return "", err
	}
	if got {
		return wakeReconnect, nil
	}
	if err := s.calls.Do(ctx, "enqueuer listen: unlisten to stand by", func(ctx context.Context) error {
		_, err := conn.Exec(ctx, "UNLISTEN *")
		return err
	}); err != nil {
		return "", fmt.Errorf("enqueuer listen: unlisten to stand by: %w", err)
	}
	s.metrics.standby.Set(1)
	s.signals.standby.Signal(struct{}{})
	s.logger.Info("standing by: another replica is the drainer; this one sweeps every --sweep-interval and takes over when the drainer goes",
		zap.Duration("takeover_interval", s.cfg.TakeoverInterval))
	defer s.metrics.standby.Set(0)
	if err := s.standBy(ctx, conn); err != nil {
		return "", err
	}
	if err := s.calls.Do(ctx, "enqueuer listen: listen after the takeover", func(ctx context.Context) error {
		_, err := conn.Exec(ctx, listenSQL)
		return err
	}); err != nil {
		return "", fmt.Errorf("enqueuer listen: %w", err)
	}
	s.logger.Info("took over as the drainer: the previous drainer's session ended")
	s.metrics.takeovers.Inc()
	return wakeDrainer, nil
}

// standBy tries for the drainer lock on conn every --takeover-interval
// until it has it. The attempts are a loop beside the listener's
// goroutine, which waits for them and uses conn again only once the loop
// has returned.
func (s *Service) standBy(ctx context.Context, conn *pgx.Conn) error {
	took := make(chan error, 1)
	stop := lifecycle.Beside(ctx, lifecycle.Loop{
		First: s.cfg.TakeoverInterval,
		Next:  func() time.Duration { return s.cfg.TakeoverInterval },
		Pass: func(ctx context.Context) error {
			got, err := s.tryDrainerLock(ctx, conn)
			if err == nil {
				s.signals.takeoverAttempt.Signal(got)
			}
			if err != nil || got {
				select {
				case took <- err:
				default: // the first outcome ends the wait; the loop is being stopped
				}
			}
			return nil
		},
	})
	defer stop()
	select {
	case err := <-took:
		return err
	case <-ctx.Done():
		return fmt.Errorf("enqueuer listen: stand by: %w", ctx.Err())
	}
}

// tryDrainerLock is one attempt at the drainer lock, bounded by
// --database-timeout: a standby whose session went silent (a black-holed
// network) finds out at its next attempt and connects again, instead of
// standing by on a dead session while the drainer's is gone.
func (s *Service) tryDrainerLock(ctx context.Context, conn *pgx.Conn) (bool, error) {
	var got bool
	err := s.calls.Do(ctx, "enqueuer listen: try the drainer lock", func(ctx context.Context) error {
		return conn.QueryRow(ctx, drainerTryLockSQL, pgx.QueryExecModeSimpleProtocol).Scan(&got)
	})
	if err != nil {
		return false, fmt.Errorf("enqueuer listen: try the drainer lock: %w", err)
	}
	return got, nil
}
