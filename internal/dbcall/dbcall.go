// Package dbcall bounds every database call idemd makes, so that a fault
// that says nothing (a black-holed network, a frozen server, a half-open
// connection) costs a failed call and a retry instead of a daemon blocked
// until the kernel gives up, about 15 minutes, or forever.
//
// Two layers, because neither covers every fault:
//
//   - the connection (dial.go): TCP keepalives and TCP_USER_TIMEOUT on
//     every socket, connect_timeout on every new connection, and the
//     server's keepalives on sessions that hold something;
//   - the call (Bounds): each transaction or statement runs under a
//     context deadline sized from its own configured timeout, or
//     --database-timeout where none applies. pgx ends a call whose context
//     expires by setting a deadline on the socket, which closes the
//     connection; the pool then replaces it. Only this layer sees a peer
//     whose kernel still acknowledges: a userspace proxy that stopped
//     forwarding, a stopped server process.
//
// A call that ran out of its bound returns a *TimeoutError naming the
// operation. The first one starts the degraded mode: logged once, counted
// per operation (idemd_database_call_timeouts_total), reported by /readyz
// with the operation, until a later call answers, which is logged once too.
package dbcall

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/idemd/idemd/internal/config"
)

// TimeoutError is a call the database did not answer within its bound.
type TimeoutError struct {
	Op    string        // the operation, as counted (enqueuer batch)
	Bound time.Duration // the bound it ran out of
	Err   error         // what the call returned, wrapped by the operation's name
}

// Error names the bound and the call, by its own error when that names
// the operation (the errors of a call are wrapped with the operation's
// name), else by Op.
func (e *TimeoutError) Error() string {
	msg := "no answer"
	if e.Err != nil {
		msg = e.Err.Error()
	}
	if !strings.HasPrefix(msg, e.Op) {
		msg = e.Op + ": " + msg
	}
	return fmt.Sprintf("database did not answer within %s: %s", e.Bound, msg)
}

func (e *TimeoutError) Unwrap() error { return e.Err }

// IsTimeout reports whether err is, or wraps, a call that ran out of its
// bound.
func IsTimeout(err error) bool {
	var te *TimeoutError
	return errors.As(err, &te)
}

// Bounds is a process's bound for database calls and its record of the
// calls that ran out of it. A nil *Bounds (a service built without
// one, in a test) bounds calls by --database-timeout's default and records
// nothing.
type Bounds struct {
	timeout time.Duration
	logger  *zap.Logger

	timeouts   *prometheus.CounterVec
	unanswered prometheus.Gauge
	// resets are the pools' Reset (ResetOnTimeout).
	resets []func()

	// now is the clock of the degraded mode's decisions; tests replace it.
	now func() time.Time

	// degraded is true from a call that ran out of its bound until the
	// database has answered for a bound's time (answered); read without
	// the lock on every call.
	degraded   atomic.Bool
	mu         sync.Mutex
	fault      *TimeoutError // the last call that ran out of its bound; nil once a later one answered
	faultAt    time.Time     // when it ran out
	answeredAt time.Time     // the first answer since then (zero: none yet)
	lastOp     string        // the operation of the last call that ran out
	since      time.Time     // when the degraded mode began
	count      int           // calls that ran out since then
	// endedAt is when the last degraded mode ended: a call begun before it
	// that runs out after it (one with a longer bound of its own, sent into
	// the fault) is what that fault left, not a new one.
	endedAt time.Time
}

// New returns the Bounds of a process whose calls get timeout where no
// operation-specific bound applies. A nil logger logs nothing.
func New(timeout time.Duration, logger *zap.Logger) *Bounds {
	if logger == nil {
		logger = zap.NewNop()
	}
	return &Bounds{
		timeout: timeout,
		logger:  logger,
		now:     time.Now,
		timeouts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "idemd_database_call_timeouts_total",
			Help: "Database calls that did not answer within their bound (--database-timeout, or the operation's own timeout), by operation: a black-holed network, a frozen or overloaded server.",
		}, []string{"operation"}),
		unanswered: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "idemd_database_unanswered",
			Help: "1 while the last database call that ran out of its bound has not been followed by one that answered.",
		}),
	}
}

// ResetOnTimeout has every call that runs out of its bound reset the pool
// whose Reset is given: close its idle connections at once and the others
// when they are released. The fault that silenced one connection
// (a network that dropped its flows, a server that froze) silenced its
// neighbours too, and each would otherwise cost a later call its whole
// bound; a pool without them opens new connections, which fail fast
// while the fault lasts and work the moment it ends. Set it before the
// first call.
func (b *Bounds) ResetOnTimeout(reset func()) {
	b.resets = append(b.resets, reset)
}

// Collectors are the counter and the gauge, for the daemon's registry.
func (b *Bounds) Collectors() []prometheus.Collector {
	return []prometheus.Collector{b.timeouts, b.unanswered}
}

// Timeout is the bound of a call that has no bound of its own.
func (b *Bounds) Timeout() time.Duration {
	if b == nil || b.timeout <= 0 {
		return config.DatabaseDefaults().Timeout
	}
	return b.timeout
}

// Do runs fn, one database call (a statement, or a transaction from BEGIN
// to COMMIT), with a context that ends after Timeout. An error fn returns
// because that bound ran out comes back as a *TimeoutError for op, which
// fn's own errors should already name.
func (b *Bounds) Do(ctx context.Context, op string, fn func(context.Context) error) error {
	return b.DoWithin(ctx, op, b.Timeout(), fn)
}

// DoWithin is Do with an operation's own bound d (a batch's
// statement_timeout and a margin).
func (b *Bounds) DoWithin(ctx context.Context, op string, d time.Duration, fn func(context.Context) error) error {
	var started time.Time
	if b != nil {
		started = b.now()
	}
	te := &TimeoutError{Op: op, Bound: d}
	cctx, cancel := context.WithTimeoutCause(ctx, d, te)
	err := fn(cctx)
	cancel()
	switch {
	case err == nil:
		b.answered(started)
		return nil
	case context.Cause(cctx) == te,
		// A deadline inside the call (connect_timeout while the pool
		// dialed for it) is the same silence.
		ctx.Err() == nil && errors.Is(err, context.DeadlineExceeded) && !IsTimeout(err):
		te.Err = err
		b.timedOut(te, started)
		return te
	}
	return err
}

// DoStatement is Do for a call whose statements carry a server-side
// statement_timeout of statementTimeout (SET LOCAL): the server ends a
// slow statement first, with an error the operation knows what to do
// with (the reaper halves its batch), and the call's bound adds
// Timeout for the round trips around it and for a server that cannot
// answer even that.
func (b *Bounds) DoStatement(ctx context.Context, op string, statementTimeout time.Duration, fn func(context.Context) error) error {
	return b.DoWithin(ctx, op, statementTimeout+b.Timeout(), fn)
}

// Cleanup is the context of what ends a call that failed or was cut
// short: a ROLLBACK, a connection's Close. It keeps ctx's values but not
// its end (a shutdown must still roll back), and has a bound of its own.
func (b *Bounds) Cleanup(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), b.Timeout())
}

// Fault is the last call that ran out of its bound, until a call begun
// after it answers: what /readyz says.
func (b *Bounds) Fault() error {
	if b == nil || !b.degraded.Load() {
		return nil
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.fault == nil {
		return nil
	}
	return b.fault
}

// timedOut counts a call that ran out of its bound and starts the degraded
// mode (one line) unless it has begun, or unless the call was begun before
// the last degraded mode ended: then it was sent into that fault, and its
// own bound outlived it.
func (b *Bounds) timedOut(te *TimeoutError, started time.Time) {
	if b == nil {
		return
	}
	b.timeouts.WithLabelValues(te.Op).Inc()
	for _, reset := range b.resets {
		reset()
	}
	now := b.now()
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.degraded.Load() && started.Before(b.endedAt) {
		return
	}
	b.fault, b.faultAt, b.answeredAt, b.lastOp = te, now, time.Time{}, te.Op
	b.count++
	if b.degraded.Load() {
		return
	}
	b.degraded.Store(true)
	b.since, b.count = now, 1
	b.unanswered.Set(1)
	b.logger.Warn("the database did not answer a call within its bound; calls fail and are retried until it answers again "+
		"(logged once, and once when it answers; idemd_database_call_timeouts_total counts the calls)",
		zap.String("operation", te.Op), zap.Duration("bound", te.Bound), zap.Error(te.Err))
}

// answered notes a call that answered. One that began after the last call
// that ran out of its bound clears Fault: an answer to a call sent before
// the fault proves nothing about now. The degraded mode ends (one line)
// at an answer a bound's time after that first one with no call running
// out between: just after a fault ends some calls still meet what it left
// (connections it silenced, a pool's connection attempts it held), and a
// line for each of those would say the fault began again.
func (b *Bounds) answered(started time.Time) {
	if b == nil || !b.degraded.Load() {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.degraded.Load() || started.Before(b.faultAt) {
		return
	}
	now := b.now()
	b.fault = nil
	if b.answeredAt.IsZero() {
		b.answeredAt = now
	}
	if now.Sub(b.answeredAt) < b.Timeout() {
		return
	}
	b.degraded.Store(false)
	b.endedAt = now
	b.unanswered.Set(0)
	b.logger.Info("the database answers again",
		zap.Duration("unanswered_for", b.answeredAt.Sub(b.since).Round(time.Millisecond)),
		zap.Int("calls_timed_out", b.count), zap.String("last_operation", b.lastOp))
}
