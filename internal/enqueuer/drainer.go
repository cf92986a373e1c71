package enqueuer

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
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
// lock, or UNLISTENs and waits for it in pg_advisory_lock (in rounds that
// prove its own session alive: waitForDrainerLock), which costs
// nothing and returns the moment the drainer's session ends: the drainer
// stopped, was killed (the kernel closes its sockets), or lost its
// connection, or its self-check failed (which ends the connection). The
// standby then LISTENs again and, its snapshot taken after LISTEN, runs a
// full pass for whatever was committed meanwhile, including the rows of
// a batch the old drainer died holding.
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

// drainerLockSQL waits for the drainer lock; drainerTryLockSQL takes it if
// it is free. The key is per schema (current_schema(): the search_path of
// the installation), since advisory locks are per database and one
// database may hold several installations.
const (
	drainerLockSQL    = `SELECT pg_advisory_lock(hashtextextended('idemd enqueuer drainer ' || current_schema(), 0))`
	drainerTryLockSQL = `SELECT pg_try_advisory_lock(hashtextextended('idemd enqueuer drainer ' || current_schema(), 0))`
)

// drainerSessionSQL sets up the listener's session. No server timeout may
// end a standby's wait or the drainer's idle listening (a role's or
// database's statement_timeout, lock_timeout or idle_session_timeout; the
// standby's rounds set a lock_timeout of their own), and
// the server is to notice a client that vanished without closing its
// socket (a partitioned node) within about half a minute, through
// keepalives while the session idles (the drainer) and the connection
// check while it waits (a standby), so the lock does not outlive its
// replica.
const drainerSessionSQL = `SET statement_timeout = 0; SET lock_timeout = 0; SET idle_session_timeout = 0;
SET tcp_keepalives_idle = 10; SET tcp_keepalives_interval = 5; SET tcp_keepalives_count = 3;
SET client_connection_check_interval = '5s'`

// elect takes the drainer lock on the listener's connection conn, or
// stands by until it can, and returns the cause of the full pass the new
// drainer runs: wakeReconnect when the lock was free (the listener just
// connected), wakeDrainer when it took over from a drainer that went away.
// A standby does not listen while it waits.
func (s *Service) elect(ctx context.Context, conn *pgx.Conn) (cause string, err error) {
	var got bool
	if err := conn.QueryRow(ctx, drainerTryLockSQL, pgx.QueryExecModeSimpleProtocol).Scan(&got); err != nil {
		return "", fmt.Errorf("enqueuer listen: try the drainer lock: %w", err)
	}
	if got {
		return wakeReconnect, nil
	}
	if _, err := conn.Exec(ctx, "UNLISTEN *"); err != nil {
		return "", fmt.Errorf("enqueuer listen: unlisten to stand by: %w", err)
	}
	s.metrics.standby.Set(1)
	s.signals.standby.Signal(struct{}{})
	s.logger.Info("standing by: another replica is the drainer; this one sweeps every --sweep-interval and takes over when the drainer goes")
	defer s.metrics.standby.Set(0)
	if err := s.waitForDrainerLock(ctx, conn); err != nil {
		return "", err
	}
	if _, err := conn.Exec(ctx, listenSQL); err != nil {
		return "", fmt.Errorf("enqueuer listen: %w", err)
	}
	s.logger.Info("took over as the drainer: the previous drainer's session ended")
	s.metrics.takeovers.Inc()
	return wakeDrainer, nil
}

// waitForDrainerLock is a standby's wait for the drainer lock on conn, in
// rounds of --listener-check-interval: the standby proves its session as
// often as the drainer proves its listener. Each round is one
// pg_advisory_lock under that lock_timeout, bounded on the client by the
// round plus --database-timeout. A round the server ends with
// lock_not_available proves the session alive, and the wait goes on; a
// round without any answer ends the wait with the call's timeout, and the
// listener connects again and stands by on a live session. Without the
// rounds, a standby whose connection went silent (a black-holed network,
// a peer whose kernel still acknowledges, where TCP keepalives see
// nothing) would wait for ever and never take over, while the drainer's
// own session ended.
func (s *Service) waitForDrainerLock(ctx context.Context, conn *pgx.Conn) error {
	round := s.cfg.ListenerCheckInterval
	setRound := fmt.Sprintf("SET lock_timeout = %d", round.Milliseconds())
	for {
		err := s.calls.DoWithin(ctx, "enqueuer listen: wait for the drainer lock", round+s.calls.Timeout(), func(ctx context.Context) error {
			if _, err := conn.Exec(ctx, setRound, pgx.QueryExecModeSimpleProtocol); err != nil {
				return fmt.Errorf("enqueuer listen: wait for the drainer lock: %w", err)
			}
			if _, err := conn.Exec(ctx, drainerLockSQL, pgx.QueryExecModeSimpleProtocol); err != nil {
				return fmt.Errorf("enqueuer listen: wait for the drainer lock: %w", err)
			}
			return nil
		})
		var pgErr *pgconn.PgError
		switch {
		case err == nil:
			// The drainer's session waits for nothing: no lock_timeout.
			if _, err := conn.Exec(ctx, "SET lock_timeout = 0", pgx.QueryExecModeSimpleProtocol); err != nil {
				return fmt.Errorf("enqueuer listen: reset lock_timeout: %w", err)
			}
			return nil
		case errors.As(err, &pgErr) && pgErr.Code == pgerrcode.LockNotAvailable:
			s.signals.standbyRound.Signal(time.Now())
		default:
			return err
		}
	}
}
