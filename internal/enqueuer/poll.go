package enqueuer

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/zap"

	"github.com/idemd/idemd/internal/dbcall"
	"github.com/idemd/idemd/internal/dbcred"
)

// Polling instead of being notified, under a stream of commits.
//
// A transaction that queued a NOTIFY takes one database-wide lock at commit
// and holds it until its commit record is flushed, so commits that notify
// cannot share a WAL flush: an API whose every request stages a job would
// commit at the rate of one flush at a time, whatever its client count. So
// while commits stream in (--busy-poll-interval, from pollStartRate
// notifications a second) the drainer polls staged_jobs instead, and the
// API's commits skip their notification. The staged_jobs trigger
// (migration 00018) decides at commit with two advisory locks keyed on the
// table's oid:
//
//   - P, the polling lock: the drainer holds it exclusively on a session of
//     its own (the gate, on the listener's URL: a session lock through a
//     transaction-mode pooler would stay with a server connection) while it
//     polls. A committing transaction probes it (takes it shared and lets
//     it go at once); one that finds it held skips its notification,
//     holding H shared until it ends.
//   - H, the handoff lock: to stop polling, the drainer takes H exclusively
//     (waiting, at most handoffTimeout, for the transactions that skipped
//     their notification to end), releases P, then H, and drains once more
//     from the low-water mark. Every transaction that skipped its
//     notification has then ended, so that drain sees its rows; every later
//     one notifies (a trigger that finds H taken notifies too).
//
// While polling, each pass drains from the sweep's low-water mark (floor.go:
// no staged row can have an id below it, now or later), which is updated
// every pollingSweepInterval, so a late commit with a low id is found by
// the next poll and the dead entries a poll walks are those of the last
// moments. The trigger never waits for a lock, and a drainer that dies
// releases P with its session, so the trigger notifies again at once; a
// drainer of an earlier release never takes P and is notified as before.
// Exactly-once does not depend on any of it (every move is one
// transaction); the protocol only decides how soon a committed row is seen.

// The advisory lock keys are (class << 32) | staged_jobs' oid, as the
// trigger computes them from TG_RELID; the classes are migration 00018's.
const (
	pollingLockClass = 0x1d3e0001
	handoffLockClass = 0x1d3e0002
)

// pollKeysSQL computes P's and H's keys for the staged_jobs the session's
// search_path names.
const pollKeysSQL = `SELECT ($1::bigint << 32) | t, ($2::bigint << 32) | t FROM (SELECT 'staged_jobs'::regclass::oid::bigint AS t) s`

// pollStartRate: from this many notifications a second the drainer polls.
// Low, because the rate the drainer hears is what the notifications let
// through: commits that notify wait for one another's flush, so under
// contention their rate collapses however many clients want to commit
// (tens a second at 64 clients on a busy two-core machine). Below it a
// notification costs the API nothing measurable.
const pollStartRate = 20.0

// pollStopRate: a polling drainer hands back to notifications once the rows
// it takes fall below this many a second (well below pollStartRate, so a
// rate near the threshold does not switch back and forth).
const pollStopRate = 5.0

// maxPollBackoff: while polls come back empty the drainer doubles its wait
// between them, from --busy-poll-interval up to this, so a stream that ebbs
// costs no more passes than rows; one that takes a row resets it.
const maxPollBackoff = 50 * time.Millisecond

// handoffTimeout bounds the handoff's wait for the transactions that skipped
// their notification to end. They hold H only while they commit, unless one
// fired the trigger early (SET CONSTRAINTS ... IMMEDIATE, or PREPARE
// TRANSACTION); then the drainer keeps polling and tries again later.
// Committing transactions notify while it waits.
const handoffTimeout = 100 * time.Millisecond

// pollingSweepInterval is how often the sweep moves the low-water mark
// while the drainer polls: each poll walks the dead entries above the mark,
// so it must follow the moves closely.
const pollingSweepInterval = 50 * time.Millisecond

// maxBusyPollInterval bounds --busy-poll-interval.
const maxBusyPollInterval = time.Second

// pollAction is what the drainer does about polling after a pass.
type pollAction int

const (
	pollStay  pollAction = iota // keep the current mode
	pollStart                   // take P and poll
	pollStop                    // hand off to notifications
)

// nextPollAction decides, after a pass: a notified drainer starts polling
// once notifications arrive at pollStartRate or more (notifyRate); a polling
// one stops once the rows it takes fall below pollStopRate (rowRate).
// Polling needs the listener and its gate (canPoll): a drainer that does
// not hear notifications could not be woken once it stopped. interval 0
// turns polling off.
func nextPollAction(polling, canPoll bool, interval time.Duration, notifyRate, rowRate float64) pollAction {
	switch {
	case polling && (!canPoll || interval <= 0 || rowRate < pollStopRate):
		return pollStop
	case !polling && canPoll && interval > 0 && notifyRate >= pollStartRate:
		return pollStart
	default:
		return pollStay
	}
}

// pollState is the drain loop's polling state; only the loop touches it.
type pollState struct {
	polling bool
	// held is the gate session P is held on (0: none). A polling drainer
	// polls whether or not it holds P; holding it is what spares the
	// API's commits their notifications.
	held    uint64
	rowRate float64   // rows taken a second (decayedRate)
	last    time.Time // when rowRate was measured
	// wait is the time to the next poll (nextPollWait).
	wait time.Duration
}

// nextPollWait is the wait before the next poll after one that took taken
// rows: --busy-poll-interval after a poll that took rows, otherwise the last
// wait doubled, at most maxPollBackoff (and never less than interval).
func nextPollWait(last, interval time.Duration, taken int) time.Duration {
	if taken > 0 || last < interval {
		return interval
	}
	return max(interval, min(2*last, maxPollBackoff))
}

// gate is the drainer's session for P. The listener opens it once it is the
// drainer and closes it when it stops being one (its session ended), so P
// never outlives the drainer lock's session by more than the time that
// takes; the loop takes and releases P through it.
type gate struct {
	mu      sync.Mutex
	cfg     *pgx.ConnConfig                              // the listener's, kept to reconnect
	auth    func(context.Context, *pgx.ConnConfig) error // the pool's BeforeConnect, or nil
	calls   *dbcall.Bounds                               // the bound of its calls
	conn    *pgx.Conn                                    // nil while closed
	gen     uint64                                       // counts sessions
	polling int64                                        // P's key; 0 until the first open
	handoff int64                                        // H's key
	lastTry time.Time                                    // the last reopen attempt
}

// open connects the gate with cfg, the listener's, its calls bounded by
// calls.
func (g *gate) open(ctx context.Context, cfg *pgx.ConnConfig, auth func(context.Context, *pgx.ConnConfig) error, calls *dbcall.Bounds) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.cfg, g.auth, g.calls = cfg, auth, calls
	return g.connect(ctx)
}

// connect opens a new session with cfg, a new generation, and reads P's and
// H's keys: one bounded call. The session sets the server's keepalives, as
// the listener's does (drainerSessionSQL): it holds P. g.mu is held.
func (g *gate) connect(ctx context.Context) error {
	return g.calls.Do(ctx, "enqueuer polling: gate", func(ctx context.Context) error {
		conn, err := dbcred.Connect(ctx, g.cfg, g.auth)
		if err != nil {
			return fmt.Errorf("enqueuer polling: the gate: %w", err)
		}
		var p, h int64
		if _, err = conn.Exec(ctx, drainerSessionSQL); err != nil {
			err = fmt.Errorf("enqueuer polling: set up the gate session: %w", err)
		} else if err = conn.QueryRow(ctx, pollKeysSQL, pollingLockClass, handoffLockClass).Scan(&p, &h); err != nil {
			err = fmt.Errorf("enqueuer polling: lock keys: %w", err)
		}
		if err != nil {
			g.closeConn(ctx, conn)
			return err
		}
		g.conn, g.polling, g.handoff = conn, p, h
		g.gen++
		return nil
	})
}

// closeConn closes a gate session within its own bound.
func (g *gate) closeConn(ctx context.Context, conn *pgx.Conn) {
	cctx, cancel := g.calls.Cleanup(ctx)
	defer cancel()
	conn.Close(cctx) //nolint:errcheck // the session's end releases P
}

// reopenEvery bounds how often the drainer retries a gate whose session
// could not be opened.
const reopenEvery = time.Second

// reopen opens the gate's session again when the last open failed (the
// listener is up: cfg is set) and reopenEvery has passed since the last try.
func (g *gate) reopen(ctx context.Context, now time.Time) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.conn != nil || g.cfg == nil || now.Sub(g.lastTry) < reopenEvery {
		return nil
	}
	g.lastTry = now
	return g.connect(ctx)
}

// revive replaces a gate session that ended under the drainer (the server
// or the network closed it; P went with it) with a new one. g.mu is held.
func (g *gate) revive(ctx context.Context) error {
	if g.conn == nil || !g.conn.IsClosed() {
		return nil
	}
	return g.connect(ctx)
}

// close ends the gate's session, releasing P if it was held, and keeps it
// closed until the next open.
func (g *gate) close(ctx context.Context) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.conn != nil {
		g.closeConn(ctx, g.conn)
	}
	g.conn, g.cfg = nil, nil
}

// current returns the open gate's generation (0: closed).
func (g *gate) current() uint64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.conn == nil {
		return 0
	}
	return g.gen
}

// take takes P on the gate's session, waiting at most handoffTimeout for
// the committing transactions that are probing it (each holds it shared
// for an instant). While it waits, committing transactions skip their
// notification as if it held P, so the drainer polls from before it asks.
// It returns the generation P was taken on (0: not taken, the wait timed
// out or the gate is closed).
func (g *gate) take(ctx context.Context) (uint64, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.conn == nil {
		return 0, nil
	}
	if err := g.revive(ctx); err != nil {
		return 0, err
	}
	gen, err := g.takeOnce(ctx)
	if err != nil && g.conn.IsClosed() {
		// The session had ended unnoticed: once more on a new one.
		if rerr := g.revive(ctx); rerr != nil {
			return 0, errors.Join(err, rerr)
		}
		return g.takeOnce(ctx)
	}
	return gen, err
}

// takeOnce is take on the current session, one bounded call; g.mu is held.
func (g *gate) takeOnce(ctx context.Context) (gen uint64, err error) {
	err = g.calls.Do(ctx, "enqueuer polling: take", func(ctx context.Context) (err error) {
		gen, err = g.takeTx(ctx)
		return err
	})
	return gen, err
}

func (g *gate) takeTx(ctx context.Context) (uint64, error) {
	tx, err := g.conn.Begin(ctx)
	if err != nil {
		return 0, fmt.Errorf("enqueuer polling: begin taking the polling lock: %w", err)
	}
	defer g.rollback(ctx, tx)
	if ok, err := lockWithin(ctx, tx, "SELECT pg_advisory_lock($1)", g.polling); !ok || err != nil {
		return 0, err
	}
	// A session lock: it stays when the transaction ends.
	if err := tx.Commit(ctx); err != nil {
		return 0, fmt.Errorf("enqueuer polling: commit taking the polling lock: %w", err)
	}
	return g.gen, nil
}

// rollback ends tx within its own bound; after Commit, a no-op.
func (g *gate) rollback(ctx context.Context, tx pgx.Tx) {
	cctx, cancel := g.calls.Cleanup(ctx)
	defer cancel()
	tx.Rollback(cctx) //nolint:errcheck // the caller's error is the one to report
}

// lockWithin runs the locking statement sql in tx within handoffTimeout;
// ok is false when the wait timed out.
func lockWithin(ctx context.Context, tx pgx.Tx, sql string, key int64) (ok bool, err error) {
	if _, err := tx.Exec(ctx, fmt.Sprintf("SET LOCAL lock_timeout = %d", handoffTimeout.Milliseconds())); err != nil {
		return false, fmt.Errorf("enqueuer polling: lock timeout: %w", err)
	}
	if _, err := tx.Exec(ctx, sql, key); err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == pgerrcode.LockNotAvailable {
			return false, nil
		}
		return false, fmt.Errorf("enqueuer polling: %s: %w", sql, err)
	}
	return true, nil
}

// release hands off from polling to notifications: H taken exclusively
// within handoffTimeout (so every transaction that skipped its
// notification has ended), then P released when the gate's session of
// generation held still holds it, then H released at commit. Through the
// pool when P is not held there (the end of the session that held it
// released it already). ok is false when the wait for H timed out: the
// drainer keeps polling.
func (g *gate) release(ctx context.Context, pool *pgxpool.Pool, held uint64) (ok bool, err error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.handoff == 0 {
		return true, nil // never opened: nothing was ever skipped
	}
	err = g.calls.Do(ctx, "enqueuer polling: handoff", func(ctx context.Context) (err error) {
		ok, err = g.releaseTx(ctx, pool, held)
		return err
	})
	return ok, err
}

// releaseTx is release's transaction; g.mu is held.
func (g *gate) releaseTx(ctx context.Context, pool *pgxpool.Pool, held uint64) (ok bool, err error) {
	var tx pgx.Tx
	onGate := held != 0 && g.conn != nil && g.gen == held
	if onGate {
		tx, err = g.conn.Begin(ctx)
	} else {
		tx, err = pool.Begin(ctx)
	}
	if err != nil {
		return false, fmt.Errorf("enqueuer polling: begin the handoff: %w", err)
	}
	defer g.rollback(ctx, tx)
	if ok, err := lockWithin(ctx, tx, "SELECT pg_advisory_xact_lock($1)", g.handoff); !ok || err != nil {
		return false, err
	}
	if onGate {
		if _, err := tx.Exec(ctx, "SELECT pg_advisory_unlock($1)", g.polling); err != nil {
			return false, fmt.Errorf("enqueuer polling: release the polling lock: %w", err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return false, fmt.Errorf("enqueuer polling: commit the handoff: %w", err)
	}
	return true, nil
}

// steerPolling runs after every pass of the drain loop: it measures the rows
// taken and starts or stops polling (nextPollAction). A handoff (handedOff)
// ends with the floor at the low-water mark and a wake-up, so the next pass
// is the drain that finds the rows of every transaction that skipped its
// notification; the loop publishes the end of polling after it.
func (s *Service) steerPolling(ctx context.Context, p *pollState, taken int, now time.Time) (handedOff bool) {
	p.rowRate = decayedRate(p.rowRate, p.last, now, float64(taken))
	p.last = now
	p.wait = nextPollWait(p.wait, s.cfg.BusyPollInterval, taken)
	gen := s.gate.current()
	notifyRate := s.floor.rate(now)
	if gen == 0 && s.cfg.BusyPollInterval > 0 && s.listening.Load() && notifyRate >= pollStartRate {
		// The gate's session could not be opened with the listener's:
		// every commit notifies meanwhile, so keep trying (and counting).
		if err := s.gate.reopen(ctx, now); err != nil {
			s.pollingFailed(err)
		}
		gen = s.gate.current()
	}
	// A poll drains from the low-water mark: without one (not established
	// yet, or ids that do not come from a CACHE 1 sequence) every poll
	// would walk the whole index.
	listening := s.listening.Load() && gen != 0
	hasMark := s.lw.mark.Load() != fullPass
	// Would poll but has no mark: the sweep establishes one at its polling
	// cadence (two sweeps).
	s.markWanted.Store(!p.polling && !hasMark && nextPollAction(false, listening, s.cfg.BusyPollInterval, notifyRate, 0) == pollStart)
	switch nextPollAction(p.polling, listening && hasMark, s.cfg.BusyPollInterval, notifyRate, p.rowRate) {
	case pollStart:
		p.polling = true
		// The notifications' rate is the rows' until polls measure them.
		p.rowRate = max(p.rowRate, notifyRate)
		s.setPolling(true)
	case pollStop:
		ok, err := s.gate.release(ctx, s.pool, p.held)
		if err != nil {
			s.pollingFailed(err)
			return false
		}
		if !ok {
			s.metrics.handoffTimeouts.Inc()
			return false
		}
		p.polling, p.held = false, 0
		s.pollFloor()
		s.signal(wakeHandoff)
		return true
	}
	if p.polling && p.held != gen {
		// Not holding P on the gate's current session (just started, the
		// last try timed out, or the listener reconnected): take it.
		held, err := s.gate.take(ctx)
		if err != nil {
			s.pollingFailed(err)
		}
		p.held = held
	}
	return false
}

// setPolling publishes the mode: the gauge, the sweep's cadence and its
// gap accounting read it. Polling ends once the handoff's drain has run, so
// no sweep counts that drain's rows as notification gaps.
func (s *Service) setPolling(on bool) {
	if s.polling.Swap(on) == on {
		return
	}
	if on {
		s.metrics.polling.Set(1)
		s.metrics.pollingStarts.Inc()
	} else {
		s.metrics.polling.Set(0)
	}
	s.signals.polling.Signal(on)
}

// pollingFailed counts a failed take or handoff and logs the first one:
// the drainer stays in its mode, which is safe either way (polling finds
// every row; notified, every commit notifies), and tries again after the
// next pass.
func (s *Service) pollingFailed(err error) {
	s.metrics.pollingErrors.Inc()
	s.pollingErrLogged.Do(func() {
		s.logger.Warn("the polling lock could not be taken or handed off; the drainer stays in its mode and retries after its next pass (logged once; idemd_enqueuer_polling_errors_total counts them)", zap.Error(err))
	})
}

// pollFloor is where a poll and the handoff's drain start: the low-water
// mark, below which no staged row exists now or can appear.
func (s *Service) pollFloor() {
	s.floor.lower(s.lw.mark.Load())
}
