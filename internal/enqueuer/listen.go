package enqueuer

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"

	"github.com/idemd/idemd/internal/backoff"
	"github.com/idemd/idemd/internal/dbcred"
	"github.com/idemd/idemd/internal/lifecycle"
)

// listenLoop holds a dedicated connection (not a pool one: LISTEN is
// session state) and turns notifications into wake-ups; it reconnects
// after a failure with the pass's backoff. After a reconnect it wakes the
// loop for a full pass, since notifications sent while it was down are
// lost. A listener that stays connected but deaf (LISTEN through a
// transaction-mode pooler "succeeds" and then hears nothing) is found by
// its self-check; the first failure of an outage is a warning, the retries
// after it are not.
func (s *Service) listenLoop() lifecycle.Loop {
	return lifecycle.Loop{
		Pass: func(ctx context.Context) error {
			heard := false
			err := s.listenOnce(ctx, func() {
				heard = true
				if s.listenFailures > 0 {
					s.logger.Info("listener is back: notifications arrive again", zap.Int("failed_attempts", s.listenFailures))
				}
				s.listenFailures = 0
			})
			if ctx.Err() != nil {
				return nil
			}
			s.listenFailures++
			s.listening.Store(false)
			s.metrics.listenerUp.Set(0)
			log := s.logger.Debug
			if s.listenFailures == 1 {
				log = s.logger.Warn
			}
			log("listener lost; waking by polling until it is back", zap.Error(err), zap.Int("failed_attempts", s.listenFailures), zap.Duration("sweep_interval", s.cfg.SweepInterval))
			if heard {
				// A connection that worked ends the outage's backoff: the
				// next attempt comes within the first retry's delay.
				return nil
			}
			return err
		},
		Next:  func() time.Duration { return backoff.Delay(1, passRetry.Base, passRetry.Max, nil) },
		Retry: passRetry,
	}
}

// listenerCheckPrefix marks the listener's own NOTIFYs on the channel;
// they are not wake-ups.
const listenerCheckPrefix = "idemd-listener-check:"

func (s *Service) listenOnce(ctx context.Context, connected func()) error {
	conn, err := s.listenConnect(ctx)
	if err != nil {
		return err
	}
	defer func() {
		cctx, cancel := s.calls.Cleanup(ctx)
		defer cancel()
		conn.Close(cctx) //nolint:errcheck // closing also releases the drainer lock
	}()
	// The first self-check proves this session hears what is committed
	// through the pool (LISTEN through a transaction-mode pooler is deaf):
	// only then may it hold the drainer lock, a session lock.
	check := &selfCheck{}
	if err := s.probeListener(ctx, conn, check); err != nil {
		return err
	}
	s.signals.listenerChecked.Signal(0)
	cause, err := s.elect(ctx, conn)
	if err != nil {
		return err
	}
	// The drainer: notifications wake the loop from here on, and a full
	// pass finds what was committed while this replica did not listen
	// (its snapshot is taken after LISTEN, so anything committed later
	// notifies).
	connected()
	if s.cfg.BusyPollInterval > 0 {
		// The polling lock's session (poll.go) lives as long as this
		// replica is the drainer.
		if err := s.gate.open(ctx, s.listenCfg, s.listenAuth, s.calls); err != nil {
			s.pollingFailed(err)
		}
		defer s.gate.close(ctx)
	}
	s.listening.Store(true)
	s.metrics.listenerUp.Set(1)
	s.trigger(cause)
	s.signals.listenerUp.Signal(struct{}{})

	lctx, cancel := context.WithCancel(ctx)
	defer cancel()
	checkErr := make(chan error, 1)
	defer lifecycle.Beside(lctx, s.checkLoop(check, func(err error) {
		checkErr <- err
		cancel()
	}))()
	for {
		n, err := conn.WaitForNotification(lctx)
		if err != nil {
			select {
			case cerr := <-checkErr: // the self-check ended the wait
				return cerr
			default:
			}
			return fmt.Errorf("enqueuer listen: wait: %w", err)
		}
		s.heard(n.Payload, check)
	}
}

// listenConnect opens the listener's session, sets it up and listens: one
// call bounded by --database-timeout.
func (s *Service) listenConnect(ctx context.Context) (*pgx.Conn, error) {
	var conn *pgx.Conn
	err := s.calls.Do(ctx, "enqueuer listen: connect", func(ctx context.Context) (err error) {
		if conn, err = dbcred.Connect(ctx, s.listenCfg, s.listenAuth); err != nil {
			return fmt.Errorf("enqueuer listen: %w", err)
		}
		if _, err = conn.Exec(ctx, drainerSessionSQL); err != nil {
			err = fmt.Errorf("enqueuer listen: set up the session: %w", err)
		} else if _, err = conn.Exec(ctx, listenSQL); err != nil {
			err = fmt.Errorf("enqueuer listen: %w", err)
		}
		if err != nil {
			cctx, cancel := s.calls.Cleanup(ctx)
			defer cancel()
			conn.Close(cctx) //nolint:errcheck // failed already
		}
		return err
	})
	return conn, err
}

// listenSQL starts listening on the channel.
var listenSQL = "LISTEN " + pgx.Identifier{NotifyChannel}.Sanitize()

// heard handles one payload on the channel: a self-check (this replica's or
// another's) or a staged_jobs notification.
func (s *Service) heard(payload string, check *selfCheck) {
	if strings.HasPrefix(payload, listenerCheckPrefix) {
		check.heard(payload)
		return
	}
	if s.hooks.dropNotification != nil && s.hooks.dropNotification(payload) {
		return
	}
	s.notified(payload)
}

// probeListener is the first self-check, on the listener's own goroutine
// before it waits for the drainer lock: it sends a NOTIFY through the
// pool and reads conn until it comes back, within --listener-check-timeout.
func (s *Service) probeListener(ctx context.Context, conn *pgx.Conn, check *selfCheck) error {
	came, err := s.sendCheck(ctx, check, "probe")
	if err != nil {
		return err
	}
	wctx, cancel := context.WithTimeout(ctx, s.cfg.ListenerCheckTimeout)
	defer cancel()
	for {
		select {
		case <-came:
			return nil
		default:
		}
		n, err := conn.WaitForNotification(wctx)
		if err != nil {
			if ctx.Err() == nil && wctx.Err() != nil {
				return s.checkFailed()
			}
			return fmt.Errorf("enqueuer listen: wait: %w", err)
		}
		s.heard(n.Payload, check)
	}
}

// notified handles a staged_jobs notification: its payload is the lowest
// id its statement inserted (migration 00015), where the next drain must
// start at the latest. One without a number makes the next drain a full
// pass. It wakes the loop only once the listener is the drainer
// (drainer.go); one heard during the first self-check, before the
// election, lowers the floor for the full pass the drainer starts with.
// A standby has stopped listening and hears none.
func (s *Service) notified(payload string) {
	low, err := strconv.ParseInt(payload, 10, 64)
	if err != nil {
		s.gap(GapNoFloor, 1, zap.String("payload", truncate(payload, 64)))
		low = fullPass
	}
	s.floor.notify(low, time.Now())
	if s.listening.Load() {
		s.signal(wakeNotify)
	}
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

// checkLoop sends a NOTIFY through the pool, the path the API's own
// notifications take, every ListenerCheckInterval and waits for it on the
// listener (probeListener did the first), so listener_up means
// notifications arrive, not merely that a connection is open. The first
// round trip that fails is handed to failed, which ends the listener's
// connection (and with it this loop).
func (s *Service) checkLoop(check *selfCheck, failed func(error)) lifecycle.Loop {
	seq := 0
	every := s.cfg.ListenerCheckInterval
	return lifecycle.Loop{
		First: every,
		Pass: func(ctx context.Context) error {
			seq++
			err := s.checkOnce(ctx, check, seq)
			if err != nil && ctx.Err() == nil {
				failed(err)
			}
			return err
		},
		Next: func() time.Duration { return every },
	}
}

// checkOnce is one self-check round trip.
func (s *Service) checkOnce(ctx context.Context, check *selfCheck, seq int) error {
	came, err := s.sendCheck(ctx, check, strconv.Itoa(seq))
	if err != nil {
		return err
	}
	timeout := time.NewTimer(s.cfg.ListenerCheckTimeout)
	defer timeout.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-timeout.C:
		return s.checkFailed()
	case <-came:
	}
	s.signals.listenerChecked.Signal(seq)
	return nil
}

// sendCheck sends this replica's self-check payload named name through
// the pool, the path the API's own notifications take, and returns a
// channel closed when the listener hears it.
func (s *Service) sendCheck(ctx context.Context, check *selfCheck, name string) (<-chan struct{}, error) {
	payload := fmt.Sprintf("%s%s:%s", listenerCheckPrefix, s.instance, name)
	// Expected before it is sent: the listener may hear it before
	// pg_notify returns.
	came := check.expect(payload)
	err := s.calls.Do(ctx, "enqueuer listen: self-check", func(ctx context.Context) error {
		if _, err := s.pool.Exec(ctx, "SELECT pg_notify($1, $2)", NotifyChannel, payload); err != nil {
			return fmt.Errorf("enqueuer listen: send the self-check NOTIFY: %w", err)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return came, nil
}

// checkFailed counts a self-check that did not come back in time and
// returns the error that ends the listener's connection.
func (s *Service) checkFailed() error {
	s.metrics.listenerCheckFailures.Inc()
	err := fmt.Errorf("enqueuer listen: a NOTIFY sent through the pool did not reach the listener within %s "+
		"(behind a transaction-mode pooler, give --listen-database-url a direct or session-mode URL)", s.cfg.ListenerCheckTimeout)
	s.signals.listenerCheckFailed.Signal(err)
	return err
}

// selfCheck picks the listener's own check out of everything it hears on
// the channel. Every replica checks its listener the same way, so each
// hears every other replica's check payloads too; the listener hands every
// check payload to heard, which compares it with the one payload the
// checker expects and ignores the rest. Nothing is queued, so no number of
// other payloads can push this replica's own out (a one-slot channel that
// dropped what did not fit once let another replica's payload in the slot
// drop this one's: the check timed out and the listener reconnected,
// listener_up 0 meanwhile).
type selfCheck struct {
	mu   sync.Mutex
	want string        // the payload the checker waits for
	came chan struct{} // closed when want is heard; nil once it was
}

// expect makes payload the one to wait for, forgetting any earlier one, and
// returns a channel closed when the listener hears it.
func (c *selfCheck) expect(payload string) <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.want, c.came = payload, make(chan struct{})
	return c.came
}

// heard is told every check payload the listener hears: the expected one
// closes the checker's channel; other replicas' and earlier ones of ours
// are ignored.
func (c *selfCheck) heard(payload string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.came != nil && payload == c.want {
		close(c.came)
		c.came = nil
	}
}
