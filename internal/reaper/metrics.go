package reaper

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemd/idemd/internal/reaper/throttle"
	"github.com/idemd/idemd/internal/review"
	"github.com/idemd/idemd/internal/runhistory"
)

// Run results, the values of the result label of idemd_reaper_runs_total.
// Every result but a dry run's is also a result of the run history, whose
// words they are (internal/runhistory).
const (
	resultComplete   = runhistory.ResultComplete   // everything eligible was reaped
	resultIncomplete = runhistory.ResultIncomplete // stopped by --max-runtime or shutdown; the next run continues
	resultLockHeld   = runhistory.ResultLockHeld   // another live run held the lease
	resultDryRun     = "dry_run"                   // nothing changed
	resultError      = runhistory.ResultError      // failed; see the log
)

// runResults lists every result above: each gets its series at 0 when the
// process starts, so the first run of a result is an increase Prometheus sees.
var runResults = []string{resultComplete, resultIncomplete, resultLockHeld, resultDryRun, resultError}

type metrics struct {
	runs           *prometheus.CounterVec
	deleted        prometheus.Counter
	flagged        *prometheus.CounterVec
	batches        prometheus.Counter
	batchTimeouts  prometheus.Counter
	lockedBatches  prometheus.Counter
	orderedBatches prometheus.Counter
	// concurrentBatches: committed in a round beside other batches.
	concurrentBatches prometheus.Counter
	runDuration       prometheus.Histogram
	batchDuration     prometheus.Histogram
	lastSuccess       *unsetGauge
	leaseTakeovers    prometheus.Counter
	// throttled: seconds runs waited between batches, by reason.
	throttled *prometheus.CounterVec
	// paced: seconds runs waited for their WAL pacer, their pace rather
	// than a pressure (not in throttled, so a paced run is not "mostly
	// throttled").
	paced prometheus.Counter
	// checkpoints: checkpoints the server requested while a run reaped.
	checkpoints prometheus.Counter
	// apiFillsCycle: runs that found the API alone filling the
	// checkpoint cycle (max_wal_size too small for it).
	apiFillsCycle prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		runs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "idemd_reaper_runs_total",
			Help: "Reaper runs by result: complete, incomplete (max runtime or shutdown), lock_held, dry_run, error.",
		}, []string{"result"}),
		deleted: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "idemd_reaper_keys_deleted_total",
			Help: "Idempotency keys deleted past the retention horizon.",
		}),
		flagged: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "idemd_reaper_keys_flagged_total",
			Help: "Reviews created for keys deleted unfinished or given up by the completer, by reason.",
		}, []string{"reason"}),
		batches: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "idemd_reaper_batches_total",
			Help: "Delete batches committed.",
		}),
		batchTimeouts: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "idemd_reaper_batch_timeouts_total",
			Help: "Batches cancelled by --statement-timeout (the run retries at half the batch size).",
		}),
		lockedBatches: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "idemd_reaper_locked_batches_total",
			Help: "Batches that met a key another transaction held locked and were redone skipping locked keys.",
		}),
		orderedBatches: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "idemd_reaper_ordered_batches_total",
			Help: "Batches whose created_at range held nothing to delete (more than a batch of keys on one created_at, or all in flight), redone in id order.",
		}),
		concurrentBatches: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "idemd_reaper_concurrent_batches_total",
			Help: "Batches committed in a round beside other batches (--concurrency above 1).",
		}),
		runDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "idemd_reaper_run_duration_seconds",
			Help:    "Duration of reaper runs that took the lock.",
			Buckets: prometheus.ExponentialBuckets(0.01, 4, 10), // 10 ms .. ~45 min
		}),
		batchDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "idemd_reaper_batch_duration_seconds",
			Help:    "Duration of one delete batch (its transaction).",
			Buckets: prometheus.ExponentialBuckets(0.001, 3, 10), // 1 ms .. ~20 s
		}),
		leaseTakeovers: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "idemd_reaper_lease_takeovers_total",
			Help: "Runs that took over the lease of a run that ended without releasing it (killed, or cut off from the database).",
		}),
		throttled: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "idemd_reaper_throttled_seconds_total",
			Help: "Seconds reaper runs waited between batches for their throttle, by reason: operator, replica_lag, replica_bytes, wal_rate, commit_latency, signal_error.",
		}, []string{"reason"}),
		paced: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "idemd_reaper_paced_seconds_total",
			Help: "Seconds reaper runs waited after a round for its WAL to take its time at --max-load wal_rate (the run's pace, not counted as throttled).",
		}),
		checkpoints: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "idemd_reaper_requested_checkpoints_total",
			Help: "Checkpoints the server requested while a reaper run reaped (max_wal_size filled before checkpoint_timeout, or a CHECKPOINT); with wal_rate=auto each halves the run's WAL rate.",
		}),
		apiFillsCycle: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "idemd_reaper_checkpoint_cycle_overfull_total",
			Help: "Reaper runs (wal_rate=auto) that found the API alone writing more WAL than a checkpoint cycle holds: the server requests checkpoints with or without the reaper, whose run goes at its floor; raise max_wal_size.",
		}),
		lastSuccess: newUnsetGauge(prometheus.GaugeOpts{
			Name: "idemd_reaper_last_success_timestamp_seconds",
			Help: "Unix time of the end of the last run that completed; absent until one has (alert when it grows old).",
		}),
	}
	for _, r := range runResults {
		m.runs.WithLabelValues(r)
	}
	for _, r := range review.Reasons() {
		m.flagged.WithLabelValues(r)
	}
	for _, r := range throttle.Reasons() {
		m.throttled.WithLabelValues(string(r))
	}
	if reg == nil {
		return m, nil
	}
	for _, c := range []prometheus.Collector{m.runs, m.deleted, m.flagged, m.batches, m.batchTimeouts, m.lockedBatches, m.orderedBatches, m.concurrentBatches, m.runDuration, m.batchDuration, m.lastSuccess, m.leaseTakeovers, m.throttled, m.paced, m.checkpoints, m.apiFillsCycle} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("reaper: register metrics: %w", err)
		}
	}
	return m, nil
}
