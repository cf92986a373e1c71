// Package throttle decides whether the reaper may run its next batch, from
// what the database says about its replicas and its own load: the decision
// is pure (Throttle.Decide, on Signals and Limits), the reading of the
// signals is apart (Reader, signals.go), so the rules are table-tested and
// the I/O is tested against a real primary and standby.
//
// The model is gh-ost's: a maximum replica lag and a load ceiling pause the
// work (--max-lag, --max-load), a critical ceiling stops it
// (--critical-load), and while paused the wait adapts between a floor and
// a ceiling (--pause-min, --pause-max): it doubles while the pressure
// lasts, so a replica that is minutes behind is asked how it is doing a few
// times a minute rather than fifty times a second, and it falls back to the
// floor the moment the pressure is gone. Two limits are averages kept
// round by round instead: the server's WAL rate (WALPacer, a token bucket,
// with its checkpoint budget: Checkpoints) and the commit budget the batch
// size adapts to (Sizer).
package throttle

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
)

// Reason is why the reaper is waiting, the reason label of
// idemd_reaper_throttled_seconds_total and the run history's
// throttle_reason.
type Reason string

// Reasons, in the order Decide checks them: an operator's pause first (it
// is a decision, not a measurement), then the replicas (the issue DBAs ask
// about first), then the primary's own load.
const (
	ReasonNone          Reason = ""
	ReasonOperator      Reason = "operator"       // idemctl reaper pause
	ReasonReplicaLag    Reason = "replica_lag"    // a replica's replay lag over --max-lag
	ReasonReplicaBytes  Reason = "replica_bytes"  // a replica's replay over --max-lag-bytes behind
	ReasonWALRate       Reason = "wal_rate"       // the primary's WAL bytes/s over the load ceiling
	ReasonCommitLatency Reason = "commit_latency" // the probe's commit latency over the load ceiling
	ReasonSignalError   Reason = "signal_error"   // a signal could not be read: wait, never guess
)

// Reasons lists every reason a run can wait for, so each metric series is
// born at 0.
func Reasons() []Reason {
	return []Reason{ReasonOperator, ReasonReplicaLag, ReasonReplicaBytes, ReasonWALRate, ReasonCommitLatency, ReasonSignalError}
}

// Load is a ceiling on the primary's load; a zero field is no ceiling.
type Load struct {
	// WALRate is the server's WAL bytes per second (the API's writes and
	// the reaper's). In --max-load it is held on average while the run
	// reaps (WALPacer); in --critical-load it is the rate between two
	// readings.
	WALRate float64
	// WALRateAuto (wal_rate=auto, --max-load only): the rate that lets
	// the server's checkpoints come on checkpoint_timeout's schedule
	// (Checkpoints.WALBudget), read when the run starts.
	WALRateAuto bool
	// CommitLatency is the time a writing transaction's COMMIT takes, as
	// the probe measures it: the budget the batch size adapts to (Sizer)
	// and the ceiling between rounds.
	CommitLatency time.Duration
	// CommitLatencyAuto (commit_latency=auto, --max-load only): the budget
	// is AutoCommitBudget of the probe's quiet commit, measured after the
	// run's first batch of the smallest size.
	CommitLatencyAuto bool
}

// IsZero reports whether no ceiling is set.
func (l Load) IsZero() bool {
	return l.WALRate == 0 && l.CommitLatency == 0 && !l.WALRateAuto && !l.CommitLatencyAuto
}

// PacesWAL reports whether the run's WAL is paced (WALPacer).
func (l Load) PacesWAL() bool { return l.WALRate > 0 || l.WALRateAuto }

// ProbesCommit reports whether a commit_latency limit is set.
func (l Load) ProbesCommit() bool { return l.CommitLatency > 0 || l.CommitLatencyAuto }

// String renders l the way ParseLoad reads it.
func (l Load) String() string {
	var parts []string
	switch {
	case l.WALRateAuto:
		parts = append(parts, "wal_rate=auto")
	case l.WALRate > 0:
		parts = append(parts, "wal_rate="+formatBytes(l.WALRate))
	}
	switch {
	case l.CommitLatencyAuto:
		parts = append(parts, "commit_latency=auto")
	case l.CommitLatency > 0:
		parts = append(parts, "commit_latency="+l.CommitLatency.String())
	}
	return strings.Join(parts, ",")
}

// AutoCommitBudget is commit_latency=auto's budget from the probe's quiet
// median commit: four times it, so the machine's ordinary jitter does not
// shrink the batches, and at least autoCommitFloor, below which a
// commit's round trip and flush on a fast disk would be mistaken for the
// reaper's doing.
func AutoCommitBudget(quiet time.Duration) time.Duration {
	return max(4*quiet, autoCommitFloor)
}

const autoCommitFloor = 4 * time.Millisecond

// ParseLoad reads a ceiling in gh-ost's --max-load form: comma-separated
// name=value pairs, wal_rate (bytes per second, with an optional kB, MB or
// GB suffix, powers of 1024, or auto) and commit_latency (a Go duration,
// or auto). Empty is no ceiling.
func ParseLoad(s string) (Load, error) {
	var l Load
	seen := map[string]bool{}
	for part := range strings.SplitSeq(s, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		name, value, ok := strings.Cut(part, "=")
		name, value = strings.TrimSpace(name), strings.TrimSpace(value)
		if !ok || value == "" {
			return Load{}, fmt.Errorf("%q: want name=value (wal_rate=64MB, commit_latency=20ms, either =auto)", part)
		}
		if seen[name] {
			return Load{}, fmt.Errorf("%q is given twice", name)
		}
		seen[name] = true
		switch name {
		case "wal_rate":
			if value == "auto" {
				l.WALRateAuto = true
				continue
			}
			b, err := ParseBytes(value)
			if err != nil {
				return Load{}, fmt.Errorf("wal_rate: %w", err)
			}
			l.WALRate = b
		case "commit_latency":
			if value == "auto" {
				l.CommitLatencyAuto = true
				continue
			}
			d, err := time.ParseDuration(value)
			if err != nil {
				return Load{}, fmt.Errorf("commit_latency: %w", err)
			}
			if d <= 0 {
				return Load{}, fmt.Errorf("commit_latency %s must be positive", value)
			}
			l.CommitLatency = d
		default:
			return Load{}, fmt.Errorf("unknown load signal %q (wal_rate, commit_latency)", name)
		}
	}
	return l, nil
}

var byteUnits = []struct {
	suffix string
	factor float64
}{{"GB", 1 << 30}, {"MB", 1 << 20}, {"kB", 1 << 10}, {"B", 1}}

// ParseBytes reads a size: "64MB", "512kB", "1048576" (kB, MB and GB are
// powers of 1024, as in PostgreSQL).
func ParseBytes(s string) (float64, error) {
	factor := 1.0
	for _, u := range byteUnits {
		if strings.HasSuffix(s, u.suffix) {
			s, factor = strings.TrimSpace(strings.TrimSuffix(s, u.suffix)), u.factor
			break
		}
	}
	v, err := strconv.ParseFloat(s, 64)
	if err != nil || v <= 0 || math.IsInf(v, 0) || math.IsNaN(v) {
		return 0, fmt.Errorf("%q is not a positive size (64MB, 512kB, 1048576)", s)
	}
	return v * factor, nil
}

// humanBytes renders a measurement for people: 450.1kB.
func humanBytes(v float64) string {
	for _, u := range byteUnits {
		if v >= u.factor {
			return strconv.FormatFloat(v/u.factor, 'f', 1, 64) + u.suffix
		}
	}
	return strconv.FormatFloat(v, 'f', 0, 64) + "B"
}

// formatBytes renders a setting exactly, in its largest whole unit.
func formatBytes(v float64) string {
	for _, u := range byteUnits {
		if v >= u.factor && math.Mod(v, u.factor) == 0 {
			return strconv.FormatFloat(v/u.factor, 'f', -1, 64) + u.suffix
		}
	}
	return strconv.FormatFloat(v, 'f', -1, 64) + "B"
}

// Limits are the throttle's settings.
type Limits struct {
	// MaxLag pauses while a replica's replay lag is above it; 0: no limit.
	MaxLag time.Duration
	// MaxLagBytes pauses while a replica's replay is more WAL bytes behind
	// the primary than this; 0: no limit. It sees a replica whose replay
	// has stopped, which the time lag may not (docs/reaper.md).
	MaxLagBytes int64
	// MaxLoad pauses while the primary's load is above it.
	MaxLoad Load
	// CriticalLoad stops the run while the load is above it.
	CriticalLoad Load
	// PauseMin is the first wait of a throttled stretch, PauseMax the
	// longest: the wait doubles from one to the other while the pressure
	// lasts.
	PauseMin, PauseMax time.Duration
}

// Check returns every problem with the limits, in the flags' words.
func (l Limits) Check() []string {
	var p []string
	if l.MaxLag < 0 {
		p = append(p, "--max-lag must not be negative (0: no limit)")
	}
	if l.MaxLagBytes < 0 {
		p = append(p, "--max-lag-bytes must not be negative (0: no limit)")
	}
	if l.PauseMin <= 0 {
		p = append(p, "--pause-min must be positive")
	}
	if l.PauseMax < l.PauseMin {
		p = append(p, fmt.Sprintf("--pause-max %s must not be below --pause-min %s", l.PauseMax, l.PauseMin))
	}
	if c := l.CriticalLoad; c.WALRateAuto || c.CommitLatencyAuto {
		p = append(p, "--critical-load takes measured values, not auto")
	}
	if c, m := l.CriticalLoad, l.MaxLoad; c.WALRate > 0 && m.WALRate > 0 && c.WALRate <= m.WALRate {
		p = append(p, "--critical-load wal_rate must be above --max-load's: the run pauses before it stops")
	}
	if c, m := l.CriticalLoad, l.MaxLoad; c.CommitLatency > 0 && m.CommitLatency > 0 && c.CommitLatency <= m.CommitLatency {
		p = append(p, "--critical-load commit_latency must be above --max-load's: the run pauses before it stops")
	}
	return p
}

// Signals are what the database said, read just before a decision.
type Signals struct {
	// Paused: an operator paused the reaper (idemctl reaper pause).
	Paused bool
	// Replicas is how many replicas were seen; the lag fields are the
	// worst of them.
	Replicas int
	// Lag is the worst replay lag in time, LagBytes in WAL bytes.
	Lag      time.Duration
	LagBytes int64
	// WALRate is the primary's WAL bytes per second since the previous
	// reading; HasWALRate is false on the first reading.
	WALRate    float64
	HasWALRate bool
	// CommitLatency is the probe's COMMIT time; 0 when it was not probed.
	CommitLatency time.Duration
	// RoundCommitLatency is the median COMMIT time of the probes taken
	// while the previous round of batches ran: what the API's commits
	// waited for because of the reaper's own batches. 0 when not measured
	// (no commit_latency limit, or no round ran since the last decision).
	RoundCommitLatency time.Duration
	// At is when the signals were read, WALPosition the primary's WAL
	// position then (bytes from 0/0).
	At          time.Time
	WALPosition int64
	// RoundWAL is the WAL the server wrote while the previous round of
	// batches ran (the first reading after it): how long the pacer may
	// hold the run after it (allow), and the log's measurement. 0: no
	// round since the last decision. The pacer charges every byte between
	// two readings (WALPosition).
	RoundWAL int64
	// RequestedCheckpoints is the server's count of requested checkpoints
	// (Checkpoints.Requested), CheckpointsBegun its count of checkpoints
	// begun (timed and requested), and ControlRedo and ControlAge the redo
	// position of the last completed checkpoint the control file holds
	// and the time since that checkpoint began, by the server's clock:
	// read only when the run watches its checkpoints (Cycle).
	RequestedCheckpoints int64
	CheckpointsBegun     int64
	ControlRedo          int64
	ControlAge           time.Duration
	// Err is a signal that could not be read; the run waits rather than
	// reap blind.
	Err error
}

// Decision is what the run does before its next batch.
type Decision struct {
	// Wait is how long to wait before asking again; 0: run the batch.
	Wait time.Duration
	// Reason is why it waits or stops.
	Reason Reason
	// Stop: the critical ceiling was crossed; the run ends cleanly now
	// (its committed batches stay, the next run continues).
	Stop bool
	// Detail is the measurement behind the reason, for the log and the
	// run's record.
	Detail string
	// AfterRound: the wait is for the reaper's own previous round, which
	// slowed the API's commits although its batch could not shrink
	// further; it recurs round after round while the reaper settles on its
	// pause.
	AfterRound bool
	// Paced: the wait is the WAL pacer's, the time the previous round's
	// WAL takes at the rate: the run's pace, not a pressure, so it is not
	// counted as throttled time.
	Paced bool
	// Checkpoint: the server requested a checkpoint since the last
	// decision, and Slowed is the pacer's rate after halving for it (0:
	// not halved: no wal_rate=auto, or already at its floor).
	Checkpoint bool
	Slowed     float64
	// Cycle is the checkpoint cycle's state the decision read
	// (wal_rate=auto's guard; the zero value without it), and CycleFull
	// the wait is for room in it.
	Cycle     CycleState
	CycleFull bool
}

// Throttled reports whether the run waits.
func (d Decision) Throttled() bool { return d.Wait > 0 }

// Throttle holds the limits and the current wait of a throttled stretch.
// One run owns one; it is not safe for concurrent use.
type Throttle struct {
	limits Limits
	wait   time.Duration // the last wait of the current stretch; 0 outside one
	// after is the wait after a round whose batches slowed the probe's
	// commits past the commit_latency limit: it doubles (from --pause-min,
	// up to --pause-max) after each such round and halves after each round
	// that did not, so the reaper settles on the pause between batches
	// that keeps the API's commits under the limit.
	after time.Duration
	// pacer paces the run's WAL (Pace); nil: not paced.
	pacer *WALPacer
	// halve: a requested checkpoint halves the pacer's rate
	// (wal_rate=auto); requested is the count last seen, watching whether
	// it is being read.
	halve     bool
	requested int64
	watching  bool
	// allow is how much longer the pacer may hold the run before its
	// next round: the last round's WAL at the pacer's floor. The pacer
	// charges the server's whole WAL, so an API that alone writes more
	// than the rate would otherwise hold the run for good; with this the
	// run's own WAL still goes at the floor (an eighth of the rate), and
	// its time is the paced time the run reports.
	allow time.Duration
	// cycle guards the server's checkpoint cycle (wal_rate=auto); nil:
	// not guarded. roundCap is the most WAL it lets the next round write
	// (0: no cap).
	cycle    *Cycle
	roundCap float64
}

// New returns a throttle for limits, which Check must have passed.
func New(limits Limits) *Throttle { return &Throttle{limits: limits} }

// Pace starts pacing the run's WAL with p; halve: a requested checkpoint
// halves its rate (p is the checkpoint budget's, wal_rate=auto).
func (t *Throttle) Pace(p *WALPacer, halve bool) {
	t.pacer, t.halve = p, halve
}

// Pacer is the WAL pacer; nil when the run's WAL is not paced.
func (t *Throttle) Pacer() *WALPacer { return t.pacer }

// GuardCycle starts guarding the server's checkpoint cycle with c (with
// a pacer: wal_rate=auto); nil: no guard.
func (t *Throttle) GuardCycle(c *Cycle) { t.cycle = c }

// CycleRunWAL is the run's WAL in the checkpoint cycle before the one
// the last decision read (its share in a checkpoint the server just
// requested); 0 without the guard.
func (t *Throttle) CycleRunWAL() float64 {
	if t.cycle == nil {
		return 0
	}
	return t.cycle.lastRun
}

// RoundBytes is the most WAL the next round should write: the pacer's
// (BatchBytes), within the room the checkpoint cycle left at the last
// decision. 0 when the run is not paced.
func (t *Throttle) RoundBytes() float64 {
	if t.pacer == nil {
		return 0
	}
	b := t.pacer.BatchBytes()
	if t.roundCap > 0 {
		b = min(b, t.roundCap)
	}
	return b
}

// WatchCheckpoints starts watching the server's requested checkpoints
// from the count requested.
func (t *Throttle) WatchCheckpoints(requested int64) { t.requested, t.watching = requested, true }

// SetCommitBudget sets commit_latency=auto's budget, measured after the
// run's first batch.
func (t *Throttle) SetCommitBudget(d time.Duration) { t.limits.MaxLoad.CommitLatency = d }

// Limits returns the throttle's settings.
func (t *Throttle) Limits() Limits { return t.limits }

// Decide turns the signals into a decision: stop on the critical ceiling,
// wait on any limit (the wait doubling from --pause-min to --pause-max
// over a stretch of consecutive throttled decisions), or go on and start
// the next stretch at the floor again.
func (t *Throttle) Decide(s Signals) Decision {
	l := t.limits
	if reason, detail := crossed(l.CriticalLoad, s, true); reason != ReasonNone {
		t.wait = 0
		return Decision{Stop: true, Reason: reason, Detail: detail + " (critical)"}
	}
	var ckpt Decision
	if t.watching && s.Err == nil && s.RequestedCheckpoints > t.requested {
		t.requested = s.RequestedCheckpoints
		ckpt.Checkpoint = true
		if t.pacer != nil && t.halve && t.pacer.Halve() {
			ckpt.Slowed = t.pacer.Rate()
		}
	}
	if t.pacer != nil && s.Err == nil && s.WALPosition > 0 {
		t.pacer.Observe(s.At, s.WALPosition)
		if t.cycle != nil {
			t.cycle.Observe(s)
		}
	}
	if t.pacer != nil && s.RoundWAL > 0 {
		t.allow = time.Duration(float64(s.RoundWAL) / t.pacer.Floor() * float64(time.Second))
	}
	with := func(d Decision) Decision {
		d.Checkpoint, d.Slowed, d.Cycle = ckpt.Checkpoint, ckpt.Slowed, ckpt.Cycle
		return d
	}
	reason, detail := t.pressure(s)
	if reason == ReasonNone {
		t.wait = 0
		if t.pacer != nil {
			w := min(t.pacer.Wait(s.At), t.allow)
			t.roundCap = 0
			if t.cycle != nil {
				ckpt.Cycle = t.cycle.State(t.pacer.MinRound())
				switch ckpt.Cycle.Mode {
				case CycleFull:
					return with(Decision{Wait: CycleRecheck, Reason: ReasonWALRate, Paced: true, CycleFull: true,
						Detail: "the checkpoint cycle has no room for a round: " + ckpt.Cycle.String()})
				case CycleFloor:
					// The run's own WAL at the pacer's floor: the whole of
					// the last round's allowance, whatever the bucket holds.
					w, t.roundCap = t.allow, t.pacer.MinRound()
				default:
					t.roundCap = ckpt.Cycle.Room
					// Where the cycle's room, not the bucket, binds the
					// run, its WAL is spread over what is left of the
					// cycle rather than spent at once: a burst costs the
					// API's commits, and the later readings know more.
					if sp := ckpt.Cycle.Spread; ckpt.Cycle.Room < t.pacer.Depth() && sp > w {
						return with(Decision{Wait: min(sp, CycleRecheck), Reason: ReasonWALRate, Paced: true,
							Detail: "the run's WAL spread over the rest of the checkpoint cycle: " + ckpt.Cycle.String()})
					}
				}
			}
			if w > 0 {
				t.allow -= w
				return with(Decision{Wait: w, Reason: ReasonWALRate, Paced: true,
					Detail: fmt.Sprintf("the server's WAL paced at %s/s (the last round wrote %s)", humanBytes(t.pacer.Rate()), humanBytes(float64(s.RoundWAL)))})
			}
		}
		if d, ok := t.afterRound(s); ok {
			return with(d)
		}
		return with(Decision{})
	}
	if t.wait == 0 {
		t.wait = l.PauseMin
	} else {
		t.wait = min(2*t.wait, l.PauseMax)
	}
	return with(Decision{Wait: t.wait, Reason: reason, Detail: detail})
}

// afterRound is the wait for a round that slowed the API's commits (see
// after), when nothing else throttles; false when none is due.
func (t *Throttle) afterRound(s Signals) (Decision, bool) {
	limit := t.limits.MaxLoad.CommitLatency
	if limit == 0 || s.RoundCommitLatency == 0 {
		return Decision{}, false
	}
	if s.RoundCommitLatency <= limit {
		if t.after /= 2; t.after < t.limits.PauseMin {
			t.after = 0
		}
		return Decision{}, false
	}
	t.after = min(max(2*t.after, t.limits.PauseMin), t.limits.PauseMax)
	return Decision{Wait: t.after, Reason: ReasonCommitLatency, AfterRound: true,
		Detail: fmt.Sprintf("probe commit %s while the last round ran, over commit_latency=%s", s.RoundCommitLatency.Round(time.Microsecond), limit)}, true
}

// pressure is the first limit the signals cross.
func (t *Throttle) pressure(s Signals) (Reason, string) {
	l := t.limits
	switch {
	case s.Paused:
		return ReasonOperator, "paused by an operator"
	case s.Err != nil:
		return ReasonSignalError, s.Err.Error()
	case l.MaxLag > 0 && s.Lag > l.MaxLag:
		return ReasonReplicaLag, fmt.Sprintf("replica replay lag %s over --max-lag %s", s.Lag.Round(time.Millisecond), l.MaxLag)
	case l.MaxLagBytes > 0 && s.LagBytes > l.MaxLagBytes:
		return ReasonReplicaBytes, fmt.Sprintf("replica replay %s behind, over --max-lag-bytes %s", humanBytes(float64(s.LagBytes)), formatBytes(float64(l.MaxLagBytes)))
	}
	return crossed(l.MaxLoad, s, false)
}

// crossed is the first ceiling of load the signals are above. The
// server's WAL rate between two readings is a ceiling only when critical:
// --max-load's wal_rate is kept on average by the pacer instead.
func crossed(load Load, s Signals, critical bool) (Reason, string) {
	switch {
	case critical && load.WALRate > 0 && s.HasWALRate && s.WALRate > load.WALRate:
		return ReasonWALRate, fmt.Sprintf("WAL %s/s over wal_rate=%s", humanBytes(s.WALRate), formatBytes(load.WALRate))
	case load.CommitLatency > 0 && s.CommitLatency > load.CommitLatency:
		return ReasonCommitLatency, fmt.Sprintf("probe commit %s over commit_latency=%s", s.CommitLatency.Round(time.Microsecond), load.CommitLatency)
	}
	return ReasonNone, ""
}

// HumanRate renders a rate in bytes per second for people: 1.7MB/s.
func HumanRate(v float64) string { return humanBytes(v) + "/s" }
