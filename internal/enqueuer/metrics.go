package enqueuer

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemd/idemd/internal/riverdb"
)

// Wake-up causes, the values of the cause label of
// idemd_enqueuer_wakeups_total.
const (
	wakeNotify    = "notify"    // a notification named a committed row
	wakePoll      = "poll"      // a sweep found staged rows
	wakeReconnect = "reconnect" // the listener is back: a full pass
	wakeRetry     = "retry"     // a pass failed: a full pass after a backoff
	wakeStart     = "start"     // Start: a full pass
	wakeDrainer   = "drainer"   // a standby took over as the drainer: a full pass
	wakeHandoff   = "handoff"   // the drainer stopped polling: a drain from the low-water mark
)

// wakeCauses lists every cause above: each gets its series at 0 when the
// process starts, so the first wake-up of a cause is an increase
// Prometheus sees.
var wakeCauses = []string{wakeNotify, wakePoll, wakeReconnect, wakeRetry, wakeStart, wakeDrainer, wakeHandoff}

type metrics struct {
	// River's schema as the gate last read it (riverschema.go), and the
	// staged rows that were duplicates of a unique River job.
	riverSchemaSupported prometheus.Gauge
	riverSchemaVersion   prometheus.Gauge
	uniqueDuplicates     prometheus.Counter
	// refused is 1 while moves are refused for a cause no retry heals,
	// refusals counts the failed batches by cause (refusal.go).
	refused  prometheus.Gauge
	refusals *prometheus.CounterVec

	moved         prometheus.Counter
	deadLettered  *prometheus.CounterVec
	batchDuration prometheus.Histogram
	batchErrors   prometheus.Counter
	backlog       prometheus.Gauge
	oldestAge     prometheus.Gauge
	wakeups       *prometheus.CounterVec
	listenerUp    prometheus.Gauge
	// pollOnly is 1 when the service does not listen at all (--poll-only,
	// or a transaction-mode pooler without --listen-database-url).
	pollOnly prometheus.Gauge
	// listenerCheckFailures counts self-NOTIFY round trips that did not
	// come back: the listener was connected but deaf.
	listenerCheckFailures prometheus.Counter
	// notificationGaps counts, by reason (GapReasons), what notifications
	// failed to report (floor.go).
	notificationGaps *prometheus.CounterVec
	// sweepDuration is the sweep's probe for the lowest staged id (sweep.go).
	sweepDuration prometheus.Histogram
	// standby is 1 while the listener waits for the drainer lock
	// (drainer.go); takeovers counts the times it got it.
	standby   prometheus.Gauge
	takeovers prometheus.Counter
	// polling is 1 while the drainer polls instead of being notified
	// (poll.go); pollingStarts counts the times it started, handoffTimeouts
	// the handoffs that timed out waiting for committing transactions,
	// pollingErrors the takes and handoffs that failed.
	polling         prometheus.Gauge
	pollingStarts   prometheus.Counter
	handoffTimeouts prometheus.Counter
	pollingErrors   prometheus.Counter
}

// newMetrics creates the enqueuer's collectors, every labelled series at 0,
// and registers them with reg (nil: not registered, for tests).
func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		riverSchemaSupported: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "idemd_enqueuer_river_schema_supported",
			Help: "1 when River's schema (version and river_job's columns) is one the enqueuer writes, 0 when it moves nothing because it is not (the reason is in the log and /readyz); 1 before the first read.",
		}),
		refused: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "idemd_enqueuer_move_refused",
			Help: "1 while the enqueuer's last batch failed for a cause no retry heals (River's table dropping inserts or refusing valid jobs, permission denied, a table missing): it moves nothing and /readyz says why and what to do; 0 otherwise.",
		}),
		refusals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "idemd_enqueuer_move_refusals_total",
			Help: "Batches that failed, rolled back and left their rows staged for a cause no retry heals, by cause (jobs_dropped, table_refused, permission_denied, relation_missing).",
		}, []string{"cause"}),
		riverSchemaVersion: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "idemd_enqueuer_river_schema_version", Help: "River's schema version (river_migration, line main) as the enqueuer last read it; 0 before it could.",
		}),
		uniqueDuplicates: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "idemd_enqueuer_unique_duplicates_total",
			Help: "Staged rows taken without a new River job because River already had their unique job (or an earlier row of the same batch became it), as River's InsertTx skips a duplicate.",
		}),
		moved: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "idemd_enqueuer_jobs_moved_total", Help: "Staged jobs inserted into River.",
		}),
		deadLettered: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "idemd_enqueuer_jobs_dead_lettered_total", Help: "Staged jobs moved to staged_jobs_dead, by reason.",
		}, []string{"reason"}),
		batchDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "idemd_enqueuer_batch_duration_seconds", Help: "Duration of one move transaction.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16),
		}),
		batchErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "idemd_enqueuer_batch_errors_total", Help: "Batches that failed and were rolled back (retried).",
		}),
		backlog: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "idemd_enqueuer_backlog_jobs", Help: "Rows in staged_jobs.",
		}),
		oldestAge: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "idemd_enqueuer_oldest_staged_age_seconds", Help: "Age of the oldest row in staged_jobs (0 when empty).",
		}),
		wakeups: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "idemd_enqueuer_wakeups_total", Help: "Drain wake-up signals by cause (notify, poll, reconnect, retry, start, drainer, handoff), counted even when coalesced into a pending wake-up.",
		}, []string{"cause"}),
		listenerUp: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "idemd_enqueuer_listener_up", Help: "1 while this replica is the drainer and notifications are known to arrive: the listener is connected, holds the drainer lock and its last self-NOTIFY round trip came back.",
		}),
		pollOnly: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "idemd_enqueuer_poll_only", Help: "1 when the enqueuer does not listen and wakes only every --sweep-interval (--poll-only, or --pooler transaction without --listen-database-url).",
		}),
		listenerCheckFailures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "idemd_enqueuer_listener_check_failures_total", Help: "Self-NOTIFY round trips that did not reach the listener in time (it then reconnects).",
		}),
		notificationGaps: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "idemd_enqueuer_notification_gaps_total",
			Help: "What notifications failed to report, by reason: swept (rows only the sweep found, below rows already moved, while the listener was up) and notification_without_floor (notifications with no lowest id: migration 00015 missing). Both should stay 0.",
		}, []string{"reason"}),
		sweepDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "idemd_enqueuer_sweep_duration_seconds",
			Help:    "Duration of the sweep's probe for the lowest staged id, every --sweep-interval; it grows with the dead rows old snapshots keep in staged_jobs, off the move path.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16),
		}),
		standby: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "idemd_enqueuer_standby", Help: "1 while this replica stands by: another replica is the drainer (listens and drains when notified); this one does not listen, sweeps every --sweep-interval and waits to take over.",
		}),
		takeovers: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "idemd_enqueuer_drainer_takeovers_total", Help: "Times this replica stopped standing by and became the drainer because the previous drainer's session ended.",
		}),
		polling: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "idemd_enqueuer_polling", Help: "1 while this replica, the drainer, polls staged_jobs every --busy-poll-interval under a stream of commits instead of being notified (the API's commits then skip their NOTIFY).",
		}),
		pollingStarts: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "idemd_enqueuer_polling_starts_total", Help: "Times the drainer started polling under a stream of commits.",
		}),
		handoffTimeouts: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "idemd_enqueuer_polling_handoff_timeouts_total", Help: "Handoffs from polling back to notifications that timed out waiting for committing transactions (the drainer keeps polling and retries).",
		}),
		pollingErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "idemd_enqueuer_polling_errors_total", Help: "Failures to take the polling lock or to hand off (the drainer stays in its mode and retries); should stay 0.",
		}),
	}
	// Every reason and cause starts at 0: increase() over a series that
	// appears at 1 is 0, so the first dead-lettered row of a reason would
	// not alert.
	for _, r := range riverdb.DeadLetterReasons {
		m.deadLettered.WithLabelValues(r)
	}
	for _, r := range GapReasons {
		m.notificationGaps.WithLabelValues(r)
	}
	for _, c := range wakeCauses {
		m.wakeups.WithLabelValues(c)
	}
	for _, c := range RefusalCauses {
		m.refusals.WithLabelValues(c)
	}
	m.riverSchemaSupported.Set(1)
	if reg == nil {
		return m, nil
	}
	for _, c := range []prometheus.Collector{m.riverSchemaSupported, m.riverSchemaVersion, m.refused, m.refusals, m.uniqueDuplicates, m.moved, m.deadLettered, m.batchDuration, m.batchErrors, m.backlog, m.oldestAge, m.wakeups,
		m.listenerUp, m.pollOnly, m.listenerCheckFailures, m.notificationGaps, m.sweepDuration, m.standby, m.takeovers,
		m.polling, m.pollingStarts, m.handoffTimeouts, m.pollingErrors} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("enqueuer: register metrics: %w", err)
		}
	}
	return m, nil
}
