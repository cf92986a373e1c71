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
)

// listen holds a dedicated connection (not a pool one: LISTEN is session
// state) and turns notifications into wake-ups. After a reconnect it wakes
// the loop for a full pass, since notifications sent while it was down are
// lost. A listener that stays connected but deaf (LISTEN through a
// transaction-mode pooler "succeeds" and then hears nothing) is found by
// its self-check; the first failure of an outage is a warning, the retries
// after it are not. With --poll-only it only says so in its gauge.
func (s *Service) listen(ctx context.Context) {
	if s.cfg.PollOnly {
		s.metrics.pollOnly.Set(1)
		return
	}
	failures := 0
	for ctx.Err() == nil {
		err := s.listenOnce(ctx, func() {
			if failures > 0 {
				s.logger.Info("listener is back: notifications arrive again", zap.Int("failed_attempts", failures))
			}
			failures = 0
		})
		if ctx.Err() != nil {
			return
		}
		failures++
		s.listening.Store(false)
		s.metrics.listenerUp.Set(0)
		delay := backoff.Delay(failures, retryBase, retryMax, nil)
		log := s.logger.Debug
		if failures == 1 {
			log = s.logger.Warn
		}
		log("listener lost; waking by polling until it is back", zap.Error(err), zap.Duration("retry_in", delay), zap.Duration("poll_interval", s.cfg.PollInterval))
		t := time.NewTimer(delay)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return
		}
	}
}

// listenerCheckPrefix marks the listener's own NOTIFYs on the channel;
// they are not wake-ups.
const listenerCheckPrefix = "idemd-listener-check:"

func (s *Service) listenOnce(ctx context.Context, connected func()) error {
	conn, err := pgx.ConnectConfig(ctx, s.listenCfg.Copy())
	if err != nil {
		return fmt.Errorf("enqueuer listen: connect: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx)) //nolint:errcheck
	if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{NotifyChannel}.Sanitize()); err != nil {
		return fmt.Errorf("enqueuer listen: %w", err)
	}

	lctx, cancel := context.WithCancel(ctx)
	defer cancel()
	check := &selfCheck{}
	checkErr := make(chan error, 1)
	go func() {
		err := s.checkListener(lctx, check, connected)
		checkErr <- err
		cancel()
	}()
	for {
		n, err := conn.WaitForNotification(lctx)
		if err != nil {
			cancel()
			if cerr := <-checkErr; cerr != nil {
				return cerr
			}
			return fmt.Errorf("enqueuer listen: wait: %w", err)
		}
		if strings.HasPrefix(n.Payload, listenerCheckPrefix) {
			check.heard(n.Payload)
			continue
		}
		if s.hooks.dropNotification != nil && s.hooks.dropNotification(n.Payload) {
			continue
		}
		s.notified(n.Payload)
	}
}

// notified handles a staged_jobs notification: its payload is the lowest
// id its statement inserted (migration 00015), where the next drain must
// start at the latest. One without a number makes the next drain a full
// pass.
func (s *Service) notified(payload string) {
	low, err := strconv.ParseInt(payload, 10, 64)
	if err != nil {
		s.gap(GapNoFloor, 1, zap.String("payload", truncate(payload, 64)))
		low = fullPass
	}
	s.floor.lower(low)
	s.signal(wakeNotify)
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

// checkListener sends a NOTIFY through the pool, the path the API's own
// notifications take, and waits for it on the listener; then again every
// ListenerCheckInterval. The listener counts as up only once a round trip
// came back, so listener_up means notifications arrive, not merely that a
// connection is open. It returns (ending the listener's connection) when a
// round trip fails.
func (s *Service) checkListener(ctx context.Context, check *selfCheck, connected func()) error {
	for seq := 0; ; seq++ {
		payload := fmt.Sprintf("%s%s:%d", listenerCheckPrefix, s.instance, seq)
		// Expected before it is sent: the listener may hear it before
		// pg_notify returns.
		came := check.expect(payload)
		if _, err := s.pool.Exec(ctx, "SELECT pg_notify($1, $2)", NotifyChannel, payload); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("enqueuer listen: send the self-check NOTIFY: %w", err)
		}
		timeout := time.NewTimer(s.cfg.ListenerCheckTimeout)
		select {
		case <-ctx.Done():
			timeout.Stop()
			return nil
		case <-timeout.C:
			s.metrics.listenerCheckFailures.Inc()
			err := fmt.Errorf("enqueuer listen: a NOTIFY sent through the pool did not reach the listener within %s "+
				"(behind a transaction-mode pooler, give --listen-database-url a direct or session-mode URL)", s.cfg.ListenerCheckTimeout)
			s.signals.listenerCheckFailed.Signal(err)
			return err
		case <-came:
			timeout.Stop()
		}
		if seq == 0 {
			connected()
			s.listening.Store(true)
			s.metrics.listenerUp.Set(1)
			s.trigger(wakeReconnect)
			s.signals.listenerUp.Signal(struct{}{})
		}
		s.signals.listenerChecked.Signal(seq)
		t := time.NewTimer(s.cfg.ListenerCheckInterval)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		}
	}
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
