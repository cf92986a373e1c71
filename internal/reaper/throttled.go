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

// runThrottle is one run's throttle: its decisions' state, its reader of
// the signals (the WAL rate is measured from one reading to the next), the
// batch sizer, and the stretch the log reports on.
type runThrottle struct {
	decide *throttle.Throttle
	read   *throttle.Reader
	// size is the batch size adapting to the commit budget and the WAL
	// pacer (batchSize).
	size *throttle.Sizer
	// budget is the commit_latency the sizer adapts to; 0: none (yet:
	// autoBudget, commit_latency=auto, measures it after the first round).
	budget     time.Duration
	autoBudget bool
	// stretch is the throttled stretch in progress, for its two log lines.
	stretch stretch
	// roundCommit is the probes' median commit while the last round ran
	// (ProbeRound), for the next decision only.
	roundCommit time.Duration
	// preRound is the WAL position read just before the last round (0: no
	// round since the last reading), roundKeys the keys it deleted.
	// bytesPerKey is the server's WAL per key deleted from the start of
	// one round to the start of the next, smoothed: what sizes a round
	// for the pacer. From round start to round start, waits included,
	// because the pacer charges the whole server's WAL: an API writing
	// beside the run makes the estimate larger and the rounds smaller,
	// which errs on the side of the limit.
	preRound    int64
	roundKeys   int64
	bytesPerKey float64
	// requested counts the checkpoints the server requested during the
	// run.
	requested int64
	// cycleFullSaid and apiFillsSaid: the run said that the checkpoint
	// cycle held it, and that the API alone fills it (cycleLog).
	cycleFullSaid, apiFillsSaid bool
	// cycleMode is the guard's mode at the last decision that read it
	// (cycleSeen: one did), for the debug line on each change.
	cycleMode throttle.CycleMode
	cycleSeen bool
}

func (s *Service) newRunThrottle() *runThrottle {
	l := s.cfg.Throttle.limits()
	return &runThrottle{
		decide: throttle.New(l),
		read: &throttle.Reader{
			Primary:       s.cfg.Pool,
			Replicas:      s.cfg.Replicas,
			WatchReplicas: l.MaxLag > 0 || l.MaxLagBytes > 0,
			ProbeCommit:   l.MaxLoad.ProbesCommit() || l.CriticalLoad.CommitLatency > 0,
			Timeout:       s.cfg.StatementTimeout,
		},
		size: throttle.NewSizer(throttle.MinBatch, s.cfg.BatchSize, s.cfg.BatchSize),
	}
}

// startThrottle settles the limits a run reads before its first batch:
// wal_rate=auto's rate from the server's checkpoint settings. With a
// commit_latency budget the batches start at the smallest size and grow
// while the budget allows (commit_latency=auto's is measured after the
// first round: measureBudget).
func (s *Service) startThrottle(ctx context.Context, t *runThrottle, res *Result) error {
	l := s.cfg.Throttle.limits()
	if l.MaxLoad.PacesWAL() {
		c, err := t.read.ReadCheckpoints(ctx)
		if err != nil {
			return fmt.Errorf("reaper: throttle: %w", err)
		}
		t.decide.WatchCheckpoints(c.Requested)
		var p *throttle.WALPacer
		switch b := c.WALBudget(); {
		case l.MaxLoad.WALRateAuto && b.Rate > 0:
			p = throttle.NewBudgetPacer(b)
			t.decide.GuardCycle(throttle.NewCycle(c, b))
		case l.MaxLoad.WALRate > 0:
			p = throttle.NewWALPacer(l.MaxLoad.WALRate)
		}
		if p != nil {
			t.decide.Pace(p, l.MaxLoad.WALRateAuto)
			res.WALRate = p.Rate()
		}
	}
	t.budget = l.MaxLoad.CommitLatency
	res.CommitBudget = t.budget
	t.autoBudget = l.MaxLoad.CommitLatencyAuto
	if t.budget > 0 || t.autoBudget {
		// The batch grows from the smallest while the API's commits keep
		// the budget. (The pacer alone sizes the first round at the
		// smallest too, until it knows the WAL per key: batchSize.)
		t.size = throttle.NewSizer(throttle.MinBatch, s.cfg.BatchSize, throttle.MinBatch)
	}
	return nil
}

// measureBudget measures commit_latency=auto's budget after the run's
// first round, when that round left keys to reap: a round of the smallest
// batch, whose WAL is flushed by then, so the probes see the API's commits
// without the reaper; a run with one batch or none (an idle pass on a
// schedule) does without the fifth of a second the probes take.
func (s *Service) measureBudget(ctx context.Context, t *runThrottle, res *Result) error {
	if !t.autoBudget || t.budget > 0 {
		return nil
	}
	quiet, err := t.read.QuietCommit(ctx)
	if err != nil {
		return fmt.Errorf("reaper: throttle: %w", err)
	}
	t.budget = throttle.AutoCommitBudget(quiet)
	t.decide.SetCommitBudget(t.budget)
	res.CommitBudget = t.budget
	return nil
}

// batchSize is the next round's batch size: the sizer's, within the WAL
// the pacer allows a round (spread over the round's width), and never over
// limit (--batch-size, halved by statement timeouts).
func (t *runThrottle) batchSize(limit, width int) int {
	n := t.size.Size()
	if b := t.decide.RoundBytes(); b > 0 {
		keys := throttle.MinBatch
		if t.bytesPerKey > 0 {
			keys = int(b / t.bytesPerKey / float64(max(width, 1)))
		}
		n = t.size.Cap(keys)
	}
	return max(min(n, limit), 1)
}

// roundEnded records a round: the keys it deleted (for the WAL per key)
// and its probes. The slowest probe moves the batch size (Sizer); only
// when the batch cannot shrink does the throttle also wait after it, on
// the probes' median (Throttle's afterRound: judged by the slowest, a
// loaded machine's stalls alone would hold the run most of its time).
func (t *runThrottle) roundEnded(keys int64, probes throttle.RoundProbes) {
	t.roundKeys = keys
	atMin := t.size.AtMin()
	t.size.Observe(probes, t.budget)
	roundCommit := probes.Median
	if t.budget > 0 && probes.Worst > t.budget && !atMin {
		roundCommit = 0
	}
	t.roundCommit = roundCommit
}

// walPerKey folds a round's WAL per key into the estimate the pacer's
// batch size is computed from: the newest round weighs half, so the
// estimate follows the table (full-page images after a checkpoint) within
// a few rounds.
func (t *runThrottle) walPerKey(bytes, keys int64) {
	if bytes <= 0 || keys <= 0 {
		return
	}
	b := float64(bytes) / float64(keys)
	if t.bytesPerKey == 0 {
		t.bytesPerKey = b
		return
	}
	t.bytesPerKey = (t.bytesPerKey + b) / 2
}

// waited is what one throttleWait did: the time it waited and the reason
// of its latest wait, and a stop (with an error when it failed) when the
// run must end instead of going on.
type waited struct {
	waited time.Duration
	paced  time.Duration
	reason throttle.Reason
	stop   stop
	err    error
}

// throttleWait is asked before every round of batches whether the run may
// go on: it reads the signals and waits (counting the time in the run's
// row and idemd_reaper_throttled_seconds_total, or the pacer's in
// idemd_reaper_paced_seconds_total; the caller adds it to the Result)
// until no limit is crossed. It returns a stop when the run must end
// instead: the critical ceiling (critical_load, with the measurement), the
// run's time being up (max_runtime) or a stop request (shutdown). The wait
// happens between batches, with no transaction open, so a throttled run
// holds nothing but its lease, which the heartbeat keeps renewed.
//
// A signal that cannot be read makes the run wait (signal_error) when
// waiting may help (a replica restarting, a timeout), and fails the run when
// it cannot: a privilege or a table the role lacks.
func (s *Service) throttleWait(soft context.Context, start time.Time, run int64, t *runThrottle, res *Result) (w waited) {
	batches := res.Batches
	first := true
	for {
		sig := t.read.Read(soft)
		if soft.Err() != nil {
			w.stop.reason = stopShutdown
			return w
		}
		if first && t.preRound > 0 && sig.Err == nil && sig.WALPosition >= t.preRound {
			sig.RoundWAL = sig.WALPosition - t.preRound
		}
		first = false
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
		if d.Checkpoint {
			s.checkpointRequested(t, d, res)
		}
		s.cycleLog(t, d)
		if d.Stop {
			s.logger.Warn("the primary's load is over --critical-load: the run stops; the next run continues",
				zap.String("reason", string(d.Reason)), zap.String("measured", d.Detail), zap.Int("batches", batches))
			w.stop = stop{reason: stopCriticalLoad, detail: d.Detail}
			return w
		}
		if !d.Throttled() {
			if w.waited == 0 && w.paced == 0 && t.stretch.quiet(time.Now()) {
				s.endStretch(t)
			}
			if t.preRound > 0 && sig.Err == nil && sig.WALPosition >= t.preRound {
				t.walPerKey(sig.WALPosition-t.preRound, t.roundKeys)
				t.stretch.round(sig.WALPosition - t.preRound)
			}
			t.preRound, t.roundKeys = sig.WALPosition, 0
			return w
		}
		// The stretch's first wait, and the first wait for each other
		// reason inside it: a paced run is one stretch, and a replica
		// falling behind or a signal that cannot be read during it must
		// still be said when it starts.
		if t.stretch.start(time.Now(), d.Reason) || t.stretch.first(d.Reason) {
			level := zap.InfoLevel
			if d.Reason == throttle.ReasonSignalError {
				// A signal it cannot read: degraded, not the throttle at
				// work; the alert on a mostly throttled run covers it too.
				level = zap.WarnLevel
			}
			s.logger.Log(level, "reaper throttled: waiting before the next batch",
				zap.String("reason", string(d.Reason)), zap.String("measured", d.Detail), zap.Int("replicas", sig.Replicas))
		}
		left := s.cfg.MaxRuntime - time.Since(start)
		if left <= 0 {
			w.stop.reason = stopMaxRuntime
			return w
		}
		slept := s.sleep(soft, min(d.Wait, left))
		t.stretch.waited(time.Now(), d.Reason, slept)
		if d.Paced {
			// The run's pace: the time its last round's WAL takes at the
			// rate. Not throttled time (the run's row, the alert on a
			// mostly throttled run), which is for pressures.
			w.paced += slept
			s.metrics.paced.Add(slept.Seconds())
			continue
		}
		w.waited += slept
		w.reason = d.Reason
		s.metrics.throttled.WithLabelValues(string(d.Reason)).Add(slept.Seconds())
		s.recordThrottle(soft, run, slept, d.Reason)
	}
}

// checkpointRequested logs and counts a checkpoint the server requested
// while the run reaped: once each, with what the run does about it.
func (s *Service) checkpointRequested(t *runThrottle, d throttle.Decision, res *Result) {
	t.requested++
	res.RequestedCheckpoints++
	s.metrics.checkpoints.Inc()
	switch {
	case d.Slowed > 0:
		s.logger.Warn("the server requested a checkpoint while the reaper ran: the run halves its WAL rate",
			zap.String("wal_rate", throttle.HumanRate(d.Slowed)), zap.Float64("run_wal_in_cycle", t.decide.CycleRunWAL()))
		res.WALRate = d.Slowed
	case t.decide.Pacer() != nil:
		s.logger.Info("the server requested a checkpoint while the reaper ran (its WAL rate is --max-load wal_rate; wal_rate=auto would halve it)")
	default:
		s.logger.Info("the server requested a checkpoint while the reaper ran")
	}
}

// cycleLog says once per run that the checkpoint cycle holds the run:
// that it waits for room in it, and (a warning: the server's settings do
// not fit its API) that the API alone fills it.
//
// At debug level it says each change of what the cycle lets the run do,
// with the figures, so the run's course through a cycle can be read back.
func (s *Service) cycleLog(t *runThrottle, d throttle.Decision) {
	if d.Cycle.Threshold > 0 && (d.Cycle.Mode != t.cycleMode || !t.cycleSeen) {
		t.cycleMode, t.cycleSeen = d.Cycle.Mode, true
		s.logger.Debug("checkpoint cycle", zap.Int("mode", int(d.Cycle.Mode)), zap.Float64("room", d.Cycle.Room),
			zap.Float64("since", d.Cycle.Since), zap.Float64("api_rate", d.Cycle.API), zap.Duration("left", d.Cycle.Left))
	}
	if d.CycleFull && !t.cycleFullSaid {
		t.cycleFullSaid = true
		s.logger.Info("the checkpoint cycle has no room for the reaper's next round: the run waits for the API's rate to fall or the next checkpoint",
			zap.String("cycle", d.Cycle.String()))
	}
	if d.Cycle.APIFills && !t.apiFillsSaid {
		t.apiFillsSaid = true
		s.metrics.apiFillsCycle.Inc()
		s.logger.Warn("the API alone writes more WAL than a checkpoint cycle holds: the server requests checkpoints with or without the reaper, whose run goes at its floor; raise max_wal_size (docs/reaper.md)",
			zap.String("cycle", d.Cycle.String()), zap.String("floor", throttle.HumanRate(t.decide.Pacer().Floor())))
	}
}

// endStretch logs the end of a throttled stretch, with its totals, when
// one is in progress.
func (s *Service) endStretch(t *runThrottle) {
	st, ok := t.stretch.end(time.Now())
	if !ok {
		return
	}
	fields := []zap.Field{zap.String("reason", string(st.reason)), zap.Duration("waited", st.waitedTotal),
		zap.Duration("lasted", st.lasted), zap.Int("rounds", st.rounds), zap.Int64("wal_bytes", st.bytes)}
	for _, r := range st.reasons() {
		fields = append(fields, zap.Duration("waited_"+string(r), st.by[r]))
	}
	s.logger.Info("reaper throttle lifted", fields...)
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
