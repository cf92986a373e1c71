package reaperbench

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/zap"

	"github.com/idemd/idemd/internal/migrate"
	"github.com/idemd/idemd/internal/reaper"
	"github.com/idemd/idemd/internal/reaper/throttle"
	"github.com/idemd/idemd/internal/testing/dbtest"
	"github.com/idemd/idemd/internal/testing/scratchdb"
)

// StandbyOptions size the benchmark with a streaming standby. Zero values
// take the defaults.
type StandbyOptions struct {
	// Keys in the table, half of them past retention. Default 2,000,000
	// (the reaper deletes 1,000,000).
	Keys int
	// InsertRate of the API's insert workload, inserts per second.
	// Default 500.
	InsertRate int
	// BaselineDuration of the workload before each run. Default 5s.
	BaselineDuration time.Duration
	// Rounds: every configuration runs this many times, each on a fresh
	// load, interleaved (A B C D, A B C D, ...) so that a slow spell of
	// the machine falls on all of them alike. One window's insert p99 is
	// its ~25 worst inserts and moves by 2× between windows here, so a
	// configuration is judged by the median of its rounds. Default 1 (the
	// CI test's cost).
	Rounds int
	// Configs, when set, runs only the configurations with these keys
	// (StandbyConfigKeys), in the suite's order: a long run at 10M keys can
	// afford one configuration, not five. The first one run is the one
	// the others' keys/s are compared with.
	Configs []string
	// Server settings of the primary and the standby, "name=value" each
	// (dbtest.ClusterOptions.Settings). Default none: PostgreSQL's
	// defaults (shared_buffers 128MB, max_wal_size 1GB).
	Server []string
	// Logf, when set, receives progress lines.
	Logf func(format string, args ...any)
	// ReaperLog, when set, receives the reaper's log, debug level, as
	// JSON lines: what its throttle decided and when.
	ReaperLog *zap.Logger
	// MaxRuntime bounds each run (--max-runtime). Default
	// standbyMaxRuntime; a paced first reap of millions of keys on a
	// default server needs longer to show many checkpoint cycles.
	MaxRuntime time.Duration
}

// StandbyRow is one reaper configuration measured under the insert load
// with the standby streaming.
type StandbyRow struct {
	Name string
	// Round is the round (from 1) this run belongs to.
	Round int
	// Eligible keys were past retention just before the run; Deleted is
	// a few more: keys cross the horizon while it runs (one every 0.26 s
	// with 2M keys spread over 144 hours).
	Eligible   int64
	Deleted    int64
	Duration   time.Duration
	KeysPerSec float64
	// WALBytes the server wrote during the run, the workload's included.
	WALBytes int64
	// BaselineWALRate is the server's WAL rate (bytes/s) in the baseline
	// window, the inserts alone; RunWALPerKey the run's own WAL per key
	// deleted: WALBytes less the baseline's rate over the run, per key.
	// What the WAL budget and the run's WAL per key allow is then
	// (budget - BaselineWALRate) / RunWALPerKey keys a second.
	BaselineWALRate float64
	RunWALPerKey    float64
	// Before and During are the inserts' latencies in the baseline window
	// and while the run deleted; P99Ratio is During.P99 over Before.P99.
	Before, During Latency
	P99Ratio       float64
	// LateBefore and LateDuring are how late the inserts left this
	// process (workloadTimed): a tail there is the machine's CPU, not the
	// server. WaitsBefore and WaitsDuring are what the inserts in flight
	// waited for on the server (Waits).
	LateBefore, LateDuring   Latency
	WaitsBefore, WaitsDuring Waits
	// P99Windows is the inserts' p99 over each whole 10 s of the run, by
	// when they were due: where in a long run the tail is.
	P99Windows []time.Duration
	// WindowEvents marks each of those windows: "v" when a VACUUM ran in
	// it, "c" when a checkpoint began in it (LagSample).
	WindowEvents []string
	// The standby's replay lag, sampled on the primary every lagEvery
	// during the run: the worst, and the share of samples over 1 s
	// (replay_lag) and over 64 MB (the distance).
	LagMax      time.Duration
	LagMaxBytes int64
	LagOver1s   float64
	LagOver64MB float64
	// Timeline is the sampled lag, condensed to about a dozen points.
	Timeline []LagSample
	// WALWindows is the server's WAL rate (bytes/s) over each whole 10 s
	// of the run, one after the other, by the server's WAL position and
	// clock as sampled with the lag; WALWindowMax and WALWindowMin the
	// highest and lowest over every 10 s window starting at any sample
	// (none when the run was shorter).
	WALWindows                 []float64
	WALWindowMax, WALWindowMin float64
	// RequestedCheckpoints the server performed during the run
	// (pg_stat_bgwriter.checkpoints_req), and the run's own count and
	// WAL pacing rate at its end (Result.RequestedCheckpoints, WALRate),
	// its commit budget and final batch size.
	RequestedCheckpoints int64
	RunWALRate           float64
	CommitBudget         time.Duration
	FinalBatchSize       int
	Paced                time.Duration
	// Batches the run committed (one per round at --concurrency 1).
	Batches int
	// Throttled is the time the run waited for its throttle, and the
	// reason of its latest wait.
	Throttled      time.Duration
	ThrottleReason string
	// Complete: the run deleted everything eligible within its
	// --max-runtime (standbyMaxRuntime); otherwise StopReason says why.
	Complete   bool
	StopReason string
	// Load is how long loading the table took before this run (the
	// standby's catching up not included), for sizing longer runs.
	Load time.Duration
	// LoadAvg is the machine's /proc/loadavg right after the run: the
	// machine is shared, and a figure is read with the load it ran under.
	LoadAvg string
}

// StandbyConfig is one configuration over every round.
type StandbyConfig struct {
	Key, Name string
	Rounds    []StandbyRow
	// P99Ratios are the rounds' insert p99 ratios (each run's window over
	// the baseline window just before it), P99Median their median: the
	// figure the target is checked against.
	P99Ratios []float64
	P99Median float64
	// DuringP99Median is the median of the rounds' insert p99 while the
	// reaper ran. A baseline window that stalls (a checkpoint, the machine)
	// makes its round's ratio read far below 1; StandbyReport's
	// BaselineP99Median, over every round of every configuration, is the
	// steadier denominator.
	DuringP99Median time.Duration
	// KeysPerSecMedian is the median of the rounds' keys/s; VsFirst the
	// rounds' keys/s over the first configuration's in the same round, and
	// VsFirstMedian their median (1 for the first configuration itself).
	KeysPerSecMedian float64
	VsFirst          []float64
	VsFirstMedian    float64
	// WALMedian is the median of the rounds' WAL bytes.
	WALMedian int64
	// LagMax and LagMaxBytes are the worst over every round, LagOver1s the
	// worst round's share of samples over 1 s.
	LagMax      time.Duration
	LagMaxBytes int64
	LagOver1s   float64
	// Incomplete counts the rounds that stopped before deleting everything
	// eligible.
	Incomplete int
}

// standbyMaxRuntime bounds each run: a configuration that throttles most
// of the time shows as incomplete rather than holding the suite for the
// default hour.
const standbyMaxRuntime = 10 * time.Minute

// LagSample is one reading of the standby's lag, At from the run's start,
// with the primary's WAL position (WAL) and clock (ServerAt) then.
type LagSample struct {
	At       time.Duration
	Lag      time.Duration
	Bytes    int64
	WAL      int64
	ServerAt time.Time
	// Vacuuming: a VACUUM (autovacuum's, most likely, of the table the
	// run empties) was in progress on the primary; Checkpoints is the
	// primary's count of checkpoints begun (timed and requested). They
	// tell a stall of the inserts the run did not make itself.
	Vacuuming   bool
	Checkpoints int64
	// Dirty is the machine's dirty and under-writeback page cache, bytes
	// (/proc/meminfo; 0 elsewhere): both servers' data files are on this
	// machine's disk, and the kernel writing back hundreds of megabytes
	// makes every WAL flush on it wait.
	Dirty int64
}

// walWindow is the span the WAL rate is judged over (the issue's "every
// 10 s window").
const walWindow = 10 * time.Second

// walWindows are the WAL rates over consecutive whole windows of the
// samples, and the highest and lowest over the windows starting at any
// sample. Pure.
func walWindows(xs []LagSample) (consecutive []float64, hi, lo float64) {
	rate := func(a, b LagSample) float64 {
		return float64(b.WAL-a.WAL) / b.ServerAt.Sub(a.ServerAt).Seconds()
	}
	lo = -1
	for i := range xs {
		for j := i + 1; j < len(xs); j++ {
			if xs[j].ServerAt.Sub(xs[i].ServerAt) >= walWindow {
				r := rate(xs[i], xs[j])
				hi = max(hi, r)
				if lo < 0 || r < lo {
					lo = r
				}
				break
			}
		}
	}
	for i := 0; i < len(xs); {
		j := i + 1
		for j < len(xs) && xs[j].ServerAt.Sub(xs[i].ServerAt) < walWindow {
			j++
		}
		if j == len(xs) {
			break
		}
		consecutive = append(consecutive, rate(xs[i], xs[j]))
		i = j
	}
	return consecutive, hi, max(lo, 0)
}

// StandbyReport is the outcome of RunStandby.
type StandbyReport struct {
	Keys, PastRetention int
	InsertRate          int
	// ProbeCommit is the median COMMIT time of the throttle's probe on the
	// primary under the API's inserts alone (the first round's baseline
	// window), and CommitLimit the commit_latency the load-throttled run
	// was given (3× it).
	ProbeCommit, CommitLimit time.Duration
	Rounds                   int
	Configs                  []StandbyConfig
	// BaselineP99Median is the median insert p99 of every baseline window
	// of the suite (the inserts alone, before each run), and Server the
	// server settings it ran with.
	BaselineP99Median time.Duration
	Server            []string
}

// lagEvery is how often the standby's lag is sampled during a run.
const lagEvery = 200 * time.Millisecond

// RunStandby starts a private, durable PostgreSQL cluster (fsync and
// synchronous_commit on, as in production) with a streaming standby made by
// pg_basebackup, and measures the reaper configurations of standbyConfigs
// on a fresh load each, under the API's insert load, in opts.Rounds
// interleaved rounds: the defaults before the throttle existed (no replica
// limits), the throttled defaults, the throttled defaults with a
// commit_latency ceiling of 3× the idle probe, pt-archiver-style fixed
// sleeps (small batches, a fixed pause, no throttle), and the throttled
// defaults with smaller batches.
func RunStandby(ctx context.Context, opts StandbyOptions) (*StandbyReport, error) {
	opts.Keys = cmp.Or(opts.Keys, 2_000_000)
	opts.InsertRate = cmp.Or(opts.InsertRate, 500)
	opts.BaselineDuration = cmp.Or(opts.BaselineDuration, 5*time.Second)
	logf := opts.Logf
	if logf == nil {
		logf = func(string, ...any) {}
	}
	primary, err := dbtest.NewClusterWith(dbtest.ClusterOptions{Durable: true, Settings: opts.Server})
	if err != nil {
		return nil, fmt.Errorf("reaperbench: primary: %w", err)
	}
	defer primary.Remove()
	standby, err := primary.NewStandby()
	if err != nil {
		return nil, fmt.Errorf("reaperbench: standby: %w", err)
	}
	defer standby.Remove()

	dbURL, drop, err := scratchdb.Create(ctx, primary.URL(), "idemd_reaperbench_standby")
	if err != nil {
		return nil, fmt.Errorf("reaperbench: %w", err)
	}
	defer drop(context.WithoutCancel(ctx)) //nolint:errcheck
	cfg, err := pgxpool.ParseConfig(dbURL)
	if err != nil {
		return nil, fmt.Errorf("reaperbench: parse url: %w", err)
	}
	cfg.MaxConns = 32
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("reaperbench: pool: %w", err)
	}
	defer pool.Close()
	if _, err := migrate.Up(ctx, pool, migrate.Options{}); err != nil {
		return nil, fmt.Errorf("reaperbench: migrate: %w", err)
	}

	def := reaper.DefaultSettings()
	def.Retention = retention
	b := &bench{pool: pool, logf: logf, standbyURL: standby.URL(), reaperLog: opts.ReaperLog, maxRuntime: opts.MaxRuntime, opts: Options{Keys: opts.Keys, InsertRate: opts.InsertRate, BaselineDuration: opts.BaselineDuration, Reaper: &def}}
	base := &Report{Keys: opts.Keys}
	if err := b.prepare(ctx, base); err != nil {
		return nil, err
	}
	rep := &StandbyReport{Keys: opts.Keys, PastRetention: base.PastRetention, InsertRate: opts.InsertRate}

	configs, err := standbyConfigs(opts.Configs, rep)
	if err != nil {
		return nil, err
	}
	rep.Rounds = cmp.Or(opts.Rounds, 1)
	for round := 1; round <= rep.Rounds; round++ {
		for i, c := range configs {
			row, err := b.runConfig(ctx, base, c, round, rep)
			if err != nil {
				return nil, err
			}
			row.Round = round
			configs[i].rows = append(configs[i].rows, row)
		}
	}
	var baselines []time.Duration
	for _, c := range configs {
		rep.Configs = append(rep.Configs, summarize(c.key, c.name, c.rows, configs[0].rows))
		for _, row := range c.rows {
			baselines = append(baselines, row.Before.P99)
		}
	}
	if len(baselines) > 0 {
		rep.BaselineP99Median = median(baselines)
	}
	rep.Server = opts.Server
	return rep, nil
}

// standbyConfig is one reaper configuration of the suite and its runs.
type standbyConfig struct {
	key, name string
	mutate    func(*reaper.Settings)
	rows      []StandbyRow
}

// StandbyConfigKeys are the keys of the suite's configurations, in its
// order (StandbyOptions.Configs). StandbyExtraConfigKeys run only when
// named.
var (
	StandbyConfigKeys      = []string{"old-default", "defaults", "commit-latency", "wal-rate", "throttled"}
	StandbyExtraConfigKeys = []string{"commit-latency-10ms", "wal-auto", "fixed-sleeps", "throttled-batch-10000", "trickle"}
)

// standbyConfigs is the suite's configurations, only those of keys when
// set. The commit_latency ceiling is read from rep when the run starts: it
// is set after the first run's baseline window.
func standbyConfigs(keys []string, rep *StandbyReport) ([]standbyConfig, error) {
	noReplicaLimits := func(s *reaper.Settings) { s.Throttle.MaxLag, s.Throttle.MaxLagBytes = 0, "0" }
	// The configurations measured before the load limits' defaults keep
	// what they measured: no load limit unless they name one.
	noLoad := func(s *reaper.Settings) { s.Throttle.MaxLoad = "" }
	all := []standbyConfig{
		{key: "old-default", name: "default without throttle (batch 30000, pause 10ms)", mutate: func(s *reaper.Settings) {
			noReplicaLimits(s)
			noLoad(s)
		}},
		{key: "defaults", name: "defaults (--max-lag 1s, --max-lag-bytes 64MB, --max-load wal_rate=auto,commit_latency=auto)"},
		{key: "commit-latency", name: "replica limits + --max-load commit_latency=3× the probe under the inserts alone", mutate: func(s *reaper.Settings) {
			s.Throttle.MaxLoad = "commit_latency=" + rep.CommitLimit.String()
		}},
		{key: "wal-rate", name: "replica limits + --max-load wal_rate=3MB", mutate: func(s *reaper.Settings) {
			s.Throttle.MaxLoad = "wal_rate=3MB"
		}},
		{key: "throttled", name: "replica limits only (--max-lag 1s, --max-lag-bytes 64MB, no --max-load)", mutate: noLoad},
		// A budget above the inserts' own p99 alone (a few ms on the shared
		// server, several times the probe's quiet commit), so that the
		// issue's target (the inserts' p99 during within twice the budget)
		// measures the reaper and not the inserts' baseline.
		{key: "commit-latency-10ms", name: "replica limits + --max-load commit_latency=10ms", mutate: func(s *reaper.Settings) {
			s.Throttle.MaxLoad = "commit_latency=10ms"
		}},
		// The checkpoint budget alone: what wal_rate=auto costs a server
		// apart from the commit budget.
		{key: "wal-auto", name: "replica limits + --max-load wal_rate=auto", mutate: func(s *reaper.Settings) {
			s.Throttle.MaxLoad = "wal_rate=auto"
		}},
		{key: "fixed-sleeps", name: "fixed sleeps, pt-archiver style (batch 5000, pause 250ms, no throttle)", mutate: func(s *reaper.Settings) {
			s.BatchSize, s.BatchPause = 5000, 250*time.Millisecond
			noReplicaLimits(s)
			noLoad(s)
		}},
		// The hypothesis that a smaller batch spares the API's tail: each
		// batch's commit flushes a third of the WAL, and the inserts'
		// commits queue behind shorter flushes.
		{key: "throttled-batch-10000", name: "replica limits only with --batch-size 10000", mutate: func(s *reaper.Settings) {
			s.BatchSize = 10000
			noLoad(s)
		}},
		// The arithmetic that pacing reaches a p99 target only when the
		// batches overlap under 1 % of the inserts: 1000-key batches of a
		// few milliseconds, 250 ms apart, are busy about 1 % of the time.
		{key: "trickle", name: "trickle (batch 1000, pause 250ms, no throttle)", mutate: func(s *reaper.Settings) {
			s.BatchSize, s.BatchPause = 1000, 250*time.Millisecond
			noReplicaLimits(s)
			noLoad(s)
		}},
	}
	if len(keys) == 0 {
		return slices.DeleteFunc(all, func(c standbyConfig) bool { return slices.Contains(StandbyExtraConfigKeys, c.key) }), nil
	}
	var out []standbyConfig
	for _, c := range all {
		if slices.Contains(keys, c.key) {
			out = append(out, c)
		}
	}
	if len(out) != len(keys) {
		return nil, fmt.Errorf("reaperbench: configurations %q: want some of %q", keys, append(slices.Clone(StandbyConfigKeys), StandbyExtraConfigKeys...))
	}
	return out, nil
}

// runConfig runs one configuration on a fresh load. The very first run of
// the suite also measures the probe's commit under the inserts alone,
// which sets the commit_latency ceiling of the runs after it.
func (b *bench) runConfig(ctx context.Context, base *Report, c standbyConfig, round int, rep *StandbyReport) (StandbyRow, error) {
	s := *b.opts.Reaper
	s.MaxRuntime = cmp.Or(b.maxRuntime, standbyMaxRuntime)
	var probe *time.Duration
	first := rep.CommitLimit == 0
	if first {
		probe = &rep.ProbeCommit
	}
	if c.mutate != nil {
		c.mutate(&s)
	}
	if first && c.key == "commit-latency" {
		// Run first (by Configs), it has no measured ceiling to be given.
		return StandbyRow{}, fmt.Errorf("reaperbench: %s: needs a configuration before it to measure the probe's commit", c.key)
	}
	row, err := b.standbyRound(ctx, base, c.name, s, probe)
	if err != nil {
		return StandbyRow{}, err
	}
	if first {
		rep.CommitLimit = (3 * rep.ProbeCommit).Round(time.Microsecond)
		b.logf("probe commit under the inserts alone %s; commit_latency ceiling %s", rep.ProbeCommit, rep.CommitLimit)
	}
	b.logf("round %d, %s: %s (load average %s)", round, c.name, row.line(), row.LoadAvg)
	return row, nil
}

// summarize gives one configuration's medians over its rounds; first are
// the first configuration's rounds, in the same order.
func summarize(key, name string, rows, first []StandbyRow) StandbyConfig {
	c := StandbyConfig{Key: key, Name: name, Rounds: rows}
	var kps []float64
	var wal []int64
	var during []time.Duration
	for i, r := range rows {
		c.P99Ratios = append(c.P99Ratios, r.P99Ratio)
		during = append(during, r.During.P99)
		kps = append(kps, r.KeysPerSec)
		wal = append(wal, r.WALBytes)
		if first[i].KeysPerSec > 0 {
			c.VsFirst = append(c.VsFirst, r.KeysPerSec/first[i].KeysPerSec)
		}
		c.LagMax, c.LagMaxBytes, c.LagOver1s = max(c.LagMax, r.LagMax), max(c.LagMaxBytes, r.LagMaxBytes), max(c.LagOver1s, r.LagOver1s)
		if !r.Complete {
			c.Incomplete++
		}
	}
	c.DuringP99Median = median(during)
	c.P99Median, c.KeysPerSecMedian, c.WALMedian = median(c.P99Ratios), median(kps), median(wal)
	if len(c.VsFirst) > 0 {
		c.VsFirstMedian = median(c.VsFirst)
	}
	return c
}

// loadAvg is the machine's load average (/proc/loadavg's first three
// fields), or "?" where there is none to read.
func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if f := strings.Fields(string(b)); err == nil && len(f) >= 3 {
		return strings.Join(f[:3], " ")
	}
	return "?"
}

// standbyRound loads the table, lets the standby catch up, then runs the
// insert workload alone (after a warm-up) and while the reaper deletes,
// sampling the standby's lag.
// With probe set, the baseline window also measures the throttle's probe
// commit (its median goes into *probe).
func (b *bench) standbyRound(ctx context.Context, r *Report, name string, s reaper.Settings, probe *time.Duration) (StandbyRow, error) {
	if err := b.load(ctx, r, false); err != nil {
		return StandbyRow{}, err
	}
	loaded := r.LoadDuration
	if err := b.standbyCaughtUp(ctx); err != nil {
		return StandbyRow{}, err
	}
	// The standby's restartpoint for the load's checkpoint, now: left to
	// itself it flushes the load's pages, spread over minutes, on the disk
	// the primary's commits flush to, and the baseline windows stalled on
	// it (inserts' p99 60-150 ms with nothing else running).
	if err := b.standbyRestartpoint(ctx); err != nil {
		return StandbyRow{}, err
	}
	idle := func(d time.Duration) func(context.Context) error {
		return func(ctx context.Context) error {
			t := time.NewTimer(d)
			defer t.Stop()
			select {
			case <-t.C:
			case <-ctx.Done():
			}
			return nil
		}
	}
	// The warm-up, as in insertLatency: the first inserts into a freshly
	// loaded table read its index pages and build cached plans.
	if _, err := b.workload(ctx, idle(min(3*time.Second, 3*b.opts.BaselineDuration))); err != nil {
		return StandbyRow{}, err
	}
	window := idle(b.opts.BaselineDuration)
	if probe != nil {
		window = func(ctx context.Context) error {
			d, err := medianProbe(ctx, b.pool, b.opts.BaselineDuration)
			*probe = d
			return err
		}
	}
	baseLSN, err := b.walLSN(ctx)
	if err != nil {
		return StandbyRow{}, err
	}
	baseStart := time.Now()
	var waitsBefore, waitsDuring Waits
	before, err := b.workloadTimed(ctx, func(ctx context.Context) error {
		var err error
		waitsBefore, err = sampledWhile(ctx, window, b.sampleWaits)
		return err
	})
	if err != nil {
		return StandbyRow{}, err
	}
	baseWAL, err := b.walSince(ctx, baseLSN)
	if err != nil {
		return StandbyRow{}, err
	}
	baseRate := float64(baseWAL) / time.Since(baseStart).Seconds()
	logger := zap.NewNop()
	if b.reaperLog != nil {
		logger = b.reaperLog.With(zap.String("config", name))
	}
	svc, err := reaper.New(reaper.Config{Settings: s, Pool: b.pool, Logger: logger})
	if err != nil {
		return StandbyRow{}, err
	}
	var eligible int64
	if err := b.pool.QueryRow(ctx, `SELECT count(*) FROM idempotency_keys WHERE created_at < now() - $1::interval`, s.Retention).Scan(&eligible); err != nil {
		return StandbyRow{}, fmt.Errorf("reaperbench: count eligible: %w", err)
	}
	lsn, err := b.walLSN(ctx)
	if err != nil {
		return StandbyRow{}, err
	}
	ckptBefore, err := b.requestedCheckpoints(ctx)
	if err != nil {
		return StandbyRow{}, err
	}
	var res *reaper.Result
	var samples []LagSample
	runStart := time.Now()
	reap := func(ctx context.Context) (err error) {
		res, err = svc.RunOnce(ctx)
		return err
	}
	during, err := b.workloadTimed(ctx, func(ctx context.Context) error {
		var err error
		waitsDuring, err = sampledWhile(ctx, func(ctx context.Context) (err error) {
			samples, err = sampledWhile(ctx, reap, b.sampleLag)
			return err
		}, b.sampleWaits)
		return err
	})
	if err != nil {
		return StandbyRow{}, fmt.Errorf("reaperbench: %s: %w", name, err)
	}
	row := StandbyRow{Name: name, Eligible: eligible, Deleted: res.Deleted, Duration: res.Duration, KeysPerSec: float64(res.Deleted) / res.Duration.Seconds(),
		Before: newLatency(before.lat), During: newLatency(during.lat), Throttled: res.Throttled, ThrottleReason: res.ThrottleReason,
		Complete: res.Complete, StopReason: res.StopReason, Load: loaded}
	row.P99Ratio = float64(row.During.P99) / float64(row.Before.P99)
	row.LateBefore, row.LateDuring = newLatency(before.late), newLatency(during.late)
	row.P99Windows = p99Windows(during, runStart)
	row.WindowEvents = windowEvents(samples, len(row.P99Windows))
	row.WaitsBefore, row.WaitsDuring = waitsBefore, waitsDuring
	if row.WALBytes, err = b.walSince(ctx, lsn); err != nil {
		return StandbyRow{}, err
	}
	row.BaselineWALRate = baseRate
	if res.Deleted > 0 {
		row.RunWALPerKey = max(float64(row.WALBytes)-baseRate*res.Duration.Seconds(), 0) / float64(res.Deleted)
	}
	ckptAfter, err := b.requestedCheckpoints(ctx)
	if err != nil {
		return StandbyRow{}, err
	}
	row.RequestedCheckpoints = ckptAfter - ckptBefore
	row.RunWALRate, row.CommitBudget, row.FinalBatchSize, row.Paced, row.Batches = res.WALRate, res.CommitBudget, res.FinalBatchSize, res.Paced, res.Batches
	row.WALWindows, row.WALWindowMax, row.WALWindowMin = walWindows(samples)
	var over1s, over64 int
	for _, x := range samples {
		row.LagMax = max(row.LagMax, x.Lag)
		row.LagMaxBytes = max(row.LagMaxBytes, x.Bytes)
		if x.Lag > time.Second {
			over1s++
		}
		if x.Bytes > 64<<20 {
			over64++
		}
	}
	if n := len(samples); n > 0 {
		row.LagOver1s, row.LagOver64MB = float64(over1s)/float64(n), float64(over64)/float64(n)
		step := max(n/12, 1)
		for i := 0; i < n; i += step {
			row.Timeline = append(row.Timeline, samples[i])
		}
	}
	row.LoadAvg = loadAvg()
	return row, nil
}

// p99Windows is the p99 of the inserts due in each whole walWindow from
// start.
func p99Windows(w timedInserts, start time.Time) []time.Duration {
	var buckets [][]time.Duration
	for i, due := range w.due {
		k := int(due.Sub(start) / walWindow)
		if k < 0 {
			continue
		}
		for len(buckets) <= k {
			buckets = append(buckets, nil)
		}
		buckets[k] = append(buckets[k], w.lat[i])
	}
	// The last bucket is a partial window: left out, as walWindows does.
	var out []time.Duration
	for _, b := range buckets[:max(len(buckets)-1, 0)] {
		out = append(out, newLatency(b).P99)
	}
	return out
}

// windowEvents marks n whole 10 s windows of a run from its samples:
// "v" when any sample in the window saw a VACUUM in progress, "c" when the
// checkpoint count moved within it or since the sample before it, and
// "d" with the most dirty page cache in MB when that passed dirtyMark.
func windowEvents(xs []LagSample, n int) []string {
	out := make([]string, n)
	dirty := make([]int64, n)
	for i, x := range xs {
		k := int(x.At / walWindow)
		if k >= n {
			break
		}
		dirty[k] = max(dirty[k], x.Dirty)
		if x.Vacuuming && !strings.Contains(out[k], "v") {
			out[k] += "v"
		}
		if i > 0 && x.Checkpoints != xs[i-1].Checkpoints && !strings.Contains(out[k], "c") {
			out[k] += "c"
		}
	}
	for k, d := range dirty {
		if d > dirtyMark {
			out[k] += fmt.Sprintf("d%d", d>>20)
		}
	}
	return out
}

// dirtyMark is the dirty page cache worth marking in a window: more than
// a few WAL segments' worth.
const dirtyMark = 64 << 20

// dirtyPageCache is Dirty plus Writeback of /proc/meminfo in bytes, 0 when
// it cannot be read.
func dirtyPageCache() int64 {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0
	}
	var n int64
	for line := range strings.Lines(string(b)) {
		f := strings.Fields(line)
		if len(f) >= 2 && (f[0] == "Dirty:" || f[0] == "Writeback:") {
			kb, _ := strconv.ParseInt(f[1], 10, 64)
			n += kb << 10
		}
	}
	return n
}

// sampledWhile runs fn while sample runs beside it, and returns what
// sample gathered until fn returned, with the errors of both.
func sampledWhile[T any](ctx context.Context, fn func(context.Context) error, sample func(context.Context) (T, error)) (T, error) {
	sctx, stop := context.WithCancel(ctx)
	type sampled struct {
		v   T
		err error
	}
	done := make(chan sampled, 1)
	go func() {
		v, err := sample(sctx)
		done <- sampled{v, err}
	}()
	err := fn(ctx)
	stop()
	got := <-done
	return got.v, errors.Join(err, got.err)
}

// standbyRestartpoint runs CHECKPOINT on the standby: a restartpoint
// at the last checkpoint it replayed, done when the statement returns.
func (b *bench) standbyRestartpoint(ctx context.Context) error {
	conn, err := pgx.Connect(ctx, b.standbyURL)
	if err != nil {
		return fmt.Errorf("reaperbench: standby: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := conn.Exec(ctx, "CHECKPOINT"); err != nil {
		return fmt.Errorf("reaperbench: standby restartpoint: %w", err)
	}
	return nil
}

// standbyCaughtUp waits (polling, bounded) until the standby has replayed
// everything the primary wrote. The bound grows with the table: a load of
// 20M keys streams gigabytes the standby replays behind it.
func (b *bench) standbyCaughtUp(ctx context.Context) error {
	bound := max(5*time.Minute, time.Duration(b.opts.Keys/20_000)*time.Second)
	deadline := time.Now().Add(bound)
	for {
		var behind int64
		err := b.pool.QueryRow(ctx, `SELECT COALESCE(max(pg_wal_lsn_diff(pg_current_wal_lsn(), replay_lsn)), -1)::int8 FROM pg_stat_replication WHERE state = 'streaming'`).Scan(&behind)
		if err != nil {
			return fmt.Errorf("reaperbench: standby position: %w", err)
		}
		if behind == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("reaperbench: the standby is still %d bytes behind after %s", behind, bound)
		}
		t := time.NewTimer(50 * time.Millisecond)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
	}
}

// sampleLag reads the standby's lag every lagEvery until ctx ends.
func (b *bench) sampleLag(ctx context.Context) ([]LagSample, error) {
	start := time.Now()
	var out []LagSample
	tick := time.NewTicker(lagEvery)
	defer tick.Stop()
	for {
		var x LagSample
		var secs float64
		err := b.pool.QueryRow(ctx, `
SELECT COALESCE(max(pg_wal_lsn_diff(pg_current_wal_lsn(), replay_lsn)), 0)::int8,
       COALESCE(EXTRACT(epoch FROM max(replay_lag)), 0)::float8,
       pg_wal_lsn_diff(pg_current_wal_insert_lsn(), '0/0')::int8, clock_timestamp(),
       EXISTS (SELECT 1 FROM pg_stat_progress_vacuum),
       (SELECT checkpoints_timed + checkpoints_req FROM pg_stat_bgwriter)
FROM pg_stat_replication WHERE state <> 'backup'`).Scan(&x.Bytes, &secs, &x.WAL, &x.ServerAt, &x.Vacuuming, &x.Checkpoints)
		if err != nil {
			if ctx.Err() != nil {
				return out, nil
			}
			return out, fmt.Errorf("sample the standby's lag: %w", err)
		}
		x.At, x.Lag = time.Since(start), time.Duration(secs*float64(time.Second))
		x.Dirty = dirtyPageCache()
		out = append(out, x)
		select {
		case <-ctx.Done():
			return out, nil
		case <-tick.C:
		}
	}
}

// requestedCheckpoints is the server's count of requested checkpoints
// (PostgreSQL 15's pg_stat_bgwriter, the cluster dbtest starts).
func (b *bench) requestedCheckpoints(ctx context.Context) (int64, error) {
	var n int64
	if err := b.pool.QueryRow(ctx, `SELECT checkpoints_req FROM pg_stat_bgwriter`).Scan(&n); err != nil {
		return 0, fmt.Errorf("reaperbench: requested checkpoints: %w", err)
	}
	return n, nil
}

// medianProbe is the median of the throttle's probe commits, one every
// 50 ms for window: what commit_latency measures meanwhile.
func medianProbe(ctx context.Context, pool *pgxpool.Pool, window time.Duration) (time.Duration, error) {
	var ds []time.Duration
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for end := time.Now().Add(window); len(ds) == 0 || time.Now().Before(end); {
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-tick.C:
		}
		// The throttle's own reading, as a run with a commit_latency
		// limit takes it: the probe commit is the reaper's, not a copy.
		s := (&throttle.Reader{Primary: pool, ProbeCommit: true}).Read(ctx)
		if s.Err != nil {
			return 0, fmt.Errorf("reaperbench: probe: %w", s.Err)
		}
		ds = append(ds, s.CommitLatency)
	}
	slices.Sort(ds)
	return ds[len(ds)/2], nil
}

func (r StandbyRow) line() string {
	done := ""
	if !r.Complete {
		done = " INCOMPLETE (" + r.StopReason + ")"
	}
	windows := make([]string, len(r.WALWindows))
	for i, w := range r.WALWindows {
		windows[i] = fmt.Sprintf("%.2f", w/(1<<20))
	}
	limits := ""
	if r.RunWALRate > 0 || r.CommitBudget > 0 {
		limits = fmt.Sprintf("; run's WAL rate at its end %.2f MiB/s, commit budget %s, final batch %d, paced %s", r.RunWALRate/(1<<20), r.CommitBudget, r.FinalBatchSize, r.Paced.Round(time.Millisecond))
	}
	if r.Batches > 0 {
		limits += fmt.Sprintf(", %d batches", r.Batches)
	}
	return fmt.Sprintf("%d keys in %s (%.0f keys/s)%s, %s of WAL (the inserts alone %.2f MiB/s before; the run's own %.0f B/key), %d requested checkpoints; WAL MiB/s per 10 s [%s], any 10 s window %.2f-%.2f; inserts before: %s; during: %s; p99 %.2fx; per 10 s p99, ms (v: a VACUUM ran, c: a checkpoint began, dN: N MB of dirty page cache) [%s]; late to leave p99 %s → %s; waits before: %s; during: %s; standby lag max %s / %.1f MB, over 1s %.1f%% of samples, over 64MB %.1f%%; throttled %s %s%s",
		r.Deleted, r.Duration.Round(time.Millisecond), r.KeysPerSec, done, mb(r.WALBytes), r.BaselineWALRate/(1<<20), r.RunWALPerKey, r.RequestedCheckpoints, strings.Join(windows, " "), r.WALWindowMin/(1<<20), r.WALWindowMax/(1<<20),
		r.Before, r.During, r.P99Ratio, p99List(r.P99Windows, r.WindowEvents), r.LateBefore.P99.Round(10*time.Microsecond), r.LateDuring.P99.Round(10*time.Microsecond), r.WaitsBefore, r.WaitsDuring,
		r.LagMax.Round(time.Millisecond), float64(r.LagMaxBytes)/1e6, 100*r.LagOver1s, 100*r.LagOver64MB, r.Throttled.Round(time.Millisecond), r.ThrottleReason, limits)
}

// p99List renders the per-window p99s in milliseconds, each with its
// window's events (windowEvents).
func p99List(ds []time.Duration, events []string) string {
	parts := make([]string, len(ds))
	for i, d := range ds {
		parts[i] = fmt.Sprintf("%.1f", float64(d)/float64(time.Millisecond))
		if i < len(events) {
			parts[i] += events[i]
		}
	}
	return strings.Join(parts, " ")
}

// String renders the report for docs/benchmarks/reaper.md: every run,
// then a table of each configuration's medians over the rounds.
func (r *StandbyReport) String() string {
	var sb strings.Builder
	fmt.Fprintf(&sb, "reaper with a streaming standby: %d keys, %d past retention, %d inserts/s, %d round(s) interleaved; probe commit under the inserts alone %s (ceiling %s)\n\n",
		r.Keys, r.PastRetention, r.InsertRate, r.Rounds, r.ProbeCommit.Round(time.Microsecond), r.CommitLimit)
	for _, c := range r.Configs {
		fmt.Fprintf(&sb, "%s\n", c.Name)
		for _, row := range c.Rounds {
			fmt.Fprintf(&sb, "  round %d (loaded in %s; load average %s): %s\n  lag over time (s: lag, MB behind):", row.Round, row.Load.Round(100*time.Millisecond), row.LoadAvg, row.line())
			for _, x := range row.Timeline {
				fmt.Fprintf(&sb, " %.1f: %s, %.1f;", x.At.Seconds(), x.Lag.Round(time.Millisecond), float64(x.Bytes)/1e6)
			}
			sb.WriteString("\n")
		}
	}
	if len(r.Configs) == 0 {
		return sb.String()
	}
	server := "PostgreSQL's defaults"
	if len(r.Server) > 0 {
		server = strings.Join(r.Server, ", ")
	}
	fmt.Fprintf(&sb, "\nmedians over the rounds (server: %s); keys/s ratio against %q in the same round; insert p99 of every baseline window: median %s\n",
		server, r.Configs[0].Key, r.BaselineP99Median.Round(10*time.Microsecond))
	tw := tabwriter.NewWriter(&sb, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "configuration\tinsert p99 ratio per round\tmedian\tp99 during (median)\tover all baselines' median\tkeys/s (median)\tkeys/s ratio per round\tmedian\tWAL (median)\tlag max\tincomplete")
	for _, c := range r.Configs {
		pooled := 0.0
		if r.BaselineP99Median > 0 {
			pooled = float64(c.DuringP99Median) / float64(r.BaselineP99Median)
		}
		fmt.Fprintf(tw, "%s\t%s\t%.2fx\t%s\t%.2fx\t%.0f\t%s\t%.2fx\t%s\t%s / %.1f MB\t%d\n", c.Key, ratioList(c.P99Ratios), c.P99Median,
			c.DuringP99Median.Round(10*time.Microsecond), pooled, c.KeysPerSecMedian,
			ratioList(c.VsFirst), c.VsFirstMedian, mb(c.WALMedian), c.LagMax.Round(time.Millisecond), float64(c.LagMaxBytes)/1e6, c.Incomplete)
	}
	_ = tw.Flush()
	return sb.String()
}
