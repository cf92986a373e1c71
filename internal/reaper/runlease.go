package reaper

import (
	"cmp"
	"context"
	"fmt"
	"time"

	"go.uber.org/zap"

	"github.com/idemd/idemd/internal/dbcall"
	"github.com/idemd/idemd/internal/lease"
	"github.com/idemd/idemd/internal/lifecycle"
	"github.com/idemd/idemd/internal/runhistory"
)

// LeaseName is the reaper's row in idemd_leases, defined by the run
// history (internal/runhistory), which reads a run without an end as
// running while its holder holds it.
const LeaseName = runhistory.LeaseName

// leaseWait decides, from what successive attempts saw, whether a run that
// found the lease taken is looking at a live run (give up: a real overlap)
// or at the lease of a run that died (wait for it to expire, then take it
// over). Pure, so the rule is tested without a database.
type leaseWait struct {
	firstHolder  string
	firstRenewed time.Time
}

// verdict is what leaseWait says after an attempt.
type verdict int

const (
	verdictWait     verdict = iota // the holder may be dead: try again shortly
	verdictLive                    // another run is alive: this run does nothing
	verdictAcquired                // the lease is this run's
)

// next judges one attempt. A holder in a batch (the lease row locked) is
// alive. So is a holder seen renewing, or a new holder
// appearing, while this run waits is alive. A holder that does neither has
// its lease expire within the TTL, and the attempt after that takes it. So
// an overlapping run gives up at once or within a heartbeat, and a run
// after a killed one waits at most the TTL.
func (w *leaseWait) next(a lease.Attempt) verdict {
	switch {
	case a.Acquired:
		return verdictAcquired
	case a.Busy:
		return verdictLive
	case a.PrevHolder == "":
		// Released between the read and the upsert: try again.
		return verdictWait
	case w.firstHolder == "":
		// However recent its last renewal, the holder may have been killed
		// just after it: only a renewal seen from here proves it alive.
		w.firstHolder, w.firstRenewed = a.PrevHolder, a.PrevRenewed
		return verdictWait
	case a.PrevHolder != w.firstHolder || a.PrevRenewed.After(w.firstRenewed):
		return verdictLive
	default:
		return verdictWait
	}
}

// takeLease takes the reaper's lease for this run. It returns false, with
// res.LockHeld set, when another live run holds it. A lease left by a run
// that died is waited out (at most --lease-ttl) and taken over, so a killed
// run never turns into later runs that do nothing.
func (s *Service) takeLease(ctx context.Context, res *Result) (bool, error) {
	ttl := s.cfg.LeaseTTL
	w := &leaseWait{}
	poll := min(time.Second, ttl/10)
	// A holder must renew or expire within the TTL; twice that is a bound
	// that only a broken clock or a stuck database reaches.
	deadline := time.Now().Add(2*ttl + poll)
	for {
		var a lease.Attempt
		err := s.cfg.Calls.Do(ctx, "reaper lease: acquire", func(ctx context.Context) (err error) {
			a, err = lease.Acquire(ctx, s.cfg.Pool, LeaseName, s.holder, ttl)
			return err
		})
		if err != nil {
			return false, fmt.Errorf("reaper: take the run's lease: %w", err)
		}
		switch w.next(a) {
		case verdictAcquired:
			if a.TookOver(s.holder) {
				res.TookOverFrom = a.PrevHolder
				s.metrics.leaseTakeovers.Inc()
				s.logger.Warn("took over the lease of a reaper run that ended without releasing it (killed, or cut off from the database)",
					zap.String("previous_holder", a.PrevHolder), zap.Time("previous_renewed_at", a.PrevRenewed),
					zap.Time("previous_expired_at", a.PrevExpires))
			}
			return true, nil
		case verdictLive:
			res.LockHeld, res.LeaseHolder = true, cmp.Or(a.PrevHolder, w.firstHolder, "a run in a batch")
			s.logger.Info("another reaper run holds the lease; this run does nothing", zap.String("holder", res.LeaseHolder))
			return false, nil
		}
		if time.Now().After(deadline) {
			return false, fmt.Errorf("reaper: the lease held by %s was neither renewed nor expired within %s: check the database clock", w.firstHolder, 2*ttl)
		}
		t := time.NewTimer(poll)
		select {
		case <-ctx.Done():
			t.Stop()
			res.StopReason = stopShutdown
			return false, fmt.Errorf("reaper: waiting for the lease of %s: %w", w.firstHolder, ctx.Err())
		case <-t.C:
		}
	}
}

// heartbeatInterval is how often a run renews its lease between batches: a
// waiting run sees a live holder renew well within the TTL.
func heartbeatInterval(ttl time.Duration) time.Duration { return ttl / 4 }

// heartbeat renews the lease every heartbeatInterval while it runs beside
// a run (lifecycle.Beside), so a run busy outside its batches (the cap
// check's count) still shows it is alive. A renewal waits behind a running
// batch, which holds the lease row locked: its bound is a batch's.
func (s *Service) heartbeat() lifecycle.Loop {
	every := heartbeatInterval(s.cfg.LeaseTTL)
	return lifecycle.Loop{
		First: every,
		Pass: func(ctx context.Context) error {
			err := s.cfg.Calls.DoStatement(ctx, leaseRenewOp, s.cfg.StatementTimeout, func(ctx context.Context) error {
				return lease.Renew(ctx, s.cfg.Pool, LeaseName, s.holder, s.cfg.LeaseTTL)
			})
			if err != nil && ctx.Err() == nil {
				// The next batch's own renewal stops the run if the lease
				// is really gone; this only says why (internal/dbcall says
				// once that the database does not answer).
				log := s.logger.Warn
				if dbcall.IsTimeout(err) {
					log = s.logger.Debug
				}
				log("renewing the reaper's lease failed", zap.Error(err))
			}
			return err
		},
		Next: func() time.Duration { return every },
	}
}
