package reaper

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/zap"

	"github.com/idemd/idemd/internal/config"
	"github.com/idemd/idemd/internal/dbcall"
	"github.com/idemd/idemd/internal/reaper/throttle"
	"github.com/idemd/idemd/internal/reaperpause"
	"github.com/idemd/idemd/internal/runhistory"
)

// runThrottle is one run's throttle: its decisions' state and its reader of
// the signals (the WAL rate is measured from one reading to the next).
type runThrottle struct {
	decide *throttle.Throttle
	read   *throttle.Reader
	// reason is the reason of the stretch in progress, "" outside one:
	// the log says when a stretch starts, changes reason and ends, never
	// at every wait.
	reason throttle.Reason
	since  time.Time
	// roundCommit is the probes' median commit while the last round ran
	// (ProbeRound), for the next decision only.
	roundCommit time.Duration
}

func (s *Service) newRunThrottle() *runThrottle {
	l := s.cfg.Throttle.limits()
	return &runThrottle{
		decide: throttle.New(l),
		read: &throttle.Reader{
			Primary:       s.cfg.Pool,
			Replicas:      s.cfg.Replicas,
			WatchReplicas: l.MaxLag > 0 || l.MaxLagBytes > 0,
			ProbeCommit:   l.MaxLoad.CommitLatency > 0 || l.CriticalLoad.CommitLatency > 0,
			Timeout:       s.cfg.StatementTimeout,
		},
	}
}

// waited is what one throttleWait did: the time it waited and the reason
// of its latest wait, and a stop (with an error when it failed) when the
// run must end instead of going on.
type waited struct {
	waited time.Duration
	reason throttle.Reason
	stop   stop
	err    error
}

// throttleWait is asked before every round of batches whether the run may
// go on: it reads the signals and waits (counting the time in the run's
// row and idemd_reaper_throttled_seconds_total; the caller adds it to the
// Result) until no limit is crossed. It returns a stop when the run must
// end instead: the critical ceiling (critical_load, with the measurement),
// the run's time being up (max_runtime) or a stop request (shutdown). The
// wait happens between batches, with no transaction open, so a throttled
// run holds nothing but its lease, which the heartbeat keeps renewed.
//
// A signal that cannot be read makes the run wait (signal_error) when
// waiting may help (a replica restarting, a timeout), and fails the run when
// it cannot: a privilege or a table the role lacks.
func (s *Service) throttleWait(soft context.Context, start time.Time, run int64, t *runThrottle, batches int) (w waited) {
	for {
		sig := t.read.Read(soft)
		if soft.Err() != nil {
			w.stop.reason = stopShutdown
			return w
		}
		sig.RoundCommitLatency, t.roundCommit = t.roundCommit, 0
		var p *reaperpause.State
		err := s.cfg.Calls.Do(soft, "reaper pause", func(ctx context.Context) (err error) {
			p, err = reaperpause.Get(ctx, s.cfg.Pool)
			return err
		})
		if err != nil {
			if sig.Err == nil {
				sig.Err = err
			}
		} else {
			sig.Paused = p != nil
		}
		if permanent(sig.Err) {
			w.stop.reason, w.err = stopError, fmt.Errorf("reaper: before batch %d: throttle: %w", batches+1, sig.Err)
			return w
		}
		d := t.decide.Decide(sig)
		s.signals.decided.Signal(d)
		if d.Stop {
			s.logger.Warn("the primary's load is over --critical-load: the run stops; the next run continues",
				zap.String("reason", string(d.Reason)), zap.String("measured", d.Detail), zap.Int("batches", batches))
			w.stop = stop{reason: stopCriticalLoad, detail: d.Detail}
			return w
		}
		if !d.Throttled() {
			if t.reason != throttle.ReasonNone {
				s.logger.Info("reaper throttle lifted", zap.String("reason", string(t.reason)), zap.Duration("waited", time.Since(t.since)))
				t.reason = throttle.ReasonNone
			}
			return w
		}
		if d.AfterRound {
			// Round after round while the reaper settles on its pause: the
			// metric, the row and the summary count it, the log would
			// repeat it.
			s.logger.Debug("reaper waits after a round that slowed the API's commits", zap.String("measured", d.Detail), zap.Duration("wait", d.Wait))
		} else if d.Reason != t.reason {
			if t.reason == throttle.ReasonNone {
				t.since = time.Now()
			}
			level := zap.InfoLevel
			if d.Reason == throttle.ReasonSignalError {
				// A signal it cannot read: degraded, not the throttle at
				// work; the alert on a mostly throttled run covers it too.
				level = zap.WarnLevel
			}
			s.logger.Log(level, "reaper throttled: waiting before the next batch",
				zap.String("reason", string(d.Reason)), zap.String("measured", d.Detail), zap.Int("replicas", sig.Replicas))
			t.reason = d.Reason
		}
		left := s.cfg.MaxRuntime - time.Since(start)
		if left <= 0 {
			w.stop.reason = stopMaxRuntime
			return w
		}
		slept := s.sleep(soft, min(d.Wait, left))
		w.waited += slept
		w.reason = d.Reason
		s.metrics.throttled.WithLabelValues(string(d.Reason)).Add(slept.Seconds())
		s.recordThrottle(soft, run, slept, d.Reason)
	}
}

// permanent reports whether a signal's error is one waiting cannot fix:
// the role lacks a privilege, or the schema a table (SQLSTATE class 42).
func permanent(err error) bool {
	var pgErr *pgconn.PgError
	return errors.Is(err, throttle.ErrHiddenReplicas) || (errors.As(err, &pgErr) && strings.HasPrefix(pgErr.Code, "42"))
}

// sleep waits d or until the run is asked to stop, and says how long it
// waited.
func (s *Service) sleep(soft context.Context, d time.Duration) time.Duration {
	begin := time.Now()
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-soft.Done():
	case <-t.C:
	}
	return time.Since(begin)
}

// recordThrottle adds a wait to the run's row, so `idemctl reaper runs`
// and the console show a run waiting while it waits. A failure only costs
// the row's figure (the metric and the summary still have it): the run
// goes on.
func (s *Service) recordThrottle(ctx context.Context, run int64, waited time.Duration, reason throttle.Reason) {
	err := s.cfg.Calls.DoWithin(ctx, historyOp, s.cfg.StatementTimeout, func(ctx context.Context) error {
		return runhistory.RecordThrottle(ctx, s.cfg.Pool, run, waited, string(reason))
	})
	if err != nil && ctx.Err() == nil {
		s.logger.Warn("recording the run's throttled time in idemd_reaper_runs failed", zap.Error(err))
	}
}

// OpenReplicas opens a small pool on each --replica-url and
// --replica-url-file entry, for the throttle to read their lag; close
// closes them. Nothing here logs a URL: it may carry a password.
//
// A URL without a password logs in as the primary's pool does (primary's
// BeforeConnect: --database-password-file and --database-user-file): a
// physical standby has the primary's roles and passwords, so a rotated
// credential reaches the replicas' connections too instead of failing
// the throttle's readings. Every replica connection goes through the
// primary's tracer, so a refused login is counted with the others.
func OpenReplicas(ctx context.Context, t *ThrottleSettings, primary *pgxpool.Config) (replicas []throttle.Replica, closeAll func(), err error) {
	urls := append([]string(nil), t.ReplicaURLs...)
	if t.ReplicaURLFile != "" {
		more, err := readURLFile(t.ReplicaURLFile)
		if err != nil {
			return nil, nil, err
		}
		urls = append(urls, more...)
	}
	closeAll = func() {
		for _, r := range replicas {
			r.Pool.Close()
		}
	}
	for i, u := range urls {
		cfg, err := pgxpool.ParseConfig(u)
		if err != nil {
			closeAll()
			return nil, nil, fmt.Errorf("reaper: replica %d: not a connection URL", i+1)
		}
		// One reading at a time, once per batch: one connection.
		cfg.MaxConns, cfg.MinConns = 1, 0
		// Dialed and bounded as the primary's connections are
		// (internal/dbcall), connect_timeout the primary's unless the URL
		// sets one: a replica the network lost makes the run wait, it
		// does not hang it.
		connectTimeout := config.DatabaseDefaults().Timeout
		if primary != nil && primary.ConnConfig.ConnectTimeout > 0 {
			connectTimeout = primary.ConnConfig.ConnectTimeout
		}
		dbcall.Connections(&cfg.ConnConfig.Config, connectTimeout)
		if primary != nil {
			if cfg.ConnConfig.Password == "" {
				cfg.BeforeConnect = primary.BeforeConnect
			}
			cfg.ConnConfig.Tracer = primary.ConnConfig.Tracer
		}
		p, err := pgxpool.NewWithConfig(ctx, cfg)
		if err != nil {
			closeAll()
			return nil, nil, fmt.Errorf("reaper: replica %s: %w", throttle.ReplicaName(cfg.ConnConfig.Host, cfg.ConnConfig.Port), err)
		}
		replicas = append(replicas, throttle.Replica{Name: throttle.ReplicaName(cfg.ConnConfig.Host, cfg.ConnConfig.Port), Pool: p})
	}
	return replicas, closeAll, nil
}

// readURLFile reads one URL per line; blank lines and # comments are
// skipped.
func readURLFile(path string) ([]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("reaper: --replica-url-file: %w", err)
	}
	defer f.Close()
	var urls []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		urls = append(urls, line)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("reaper: --replica-url-file: %w", err)
	}
	return urls, nil
}
