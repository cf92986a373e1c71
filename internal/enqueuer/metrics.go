package enqueuer

import "github.com/prometheus/client_golang/prometheus"

// Metrics are the enqueuer's Prometheus collectors.
type Metrics struct {
	Moved         prometheus.Counter
	DeadLettered  *prometheus.CounterVec
	BatchDuration prometheus.Histogram
	BatchErrors   prometheus.Counter
	Backlog       prometheus.Gauge
	OldestAge     prometheus.Gauge
	Wakeups       *prometheus.CounterVec
	ListenerUp    prometheus.Gauge
	// PollOnly is 1 when the service does not listen at all (--poll-only,
	// or a transaction-mode pooler without --listen-database-url).
	PollOnly prometheus.Gauge
	// ListenerCheckFailures counts self-NOTIFY round trips that did not
	// come back: the listener was connected but deaf.
	ListenerCheckFailures prometheus.Counter
	// NotificationGaps counts, by reason (GapReasons), what notifications
	// failed to report (floor.go).
	NotificationGaps *prometheus.CounterVec
	// SweepDuration is the sweep's probe: a walk of staged_jobs_pkey from
	// its start, whose cost is the dead entries old snapshots keep.
	SweepDuration prometheus.Histogram
}

// NewMetrics creates the collectors; Register adds them to a registry.
func NewMetrics() *Metrics {
	m := &Metrics{
		Moved: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "idemd_enqueuer_jobs_moved_total", Help: "Staged jobs inserted into River.",
		}),
		DeadLettered: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "idemd_enqueuer_jobs_dead_lettered_total", Help: "Staged jobs moved to staged_jobs_dead, by reason.",
		}, []string{"reason"}),
		BatchDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "idemd_enqueuer_batch_duration_seconds", Help: "Duration of one move transaction.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16),
		}),
		BatchErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "idemd_enqueuer_batch_errors_total", Help: "Batches that failed and were rolled back (retried).",
		}),
		Backlog: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "idemd_enqueuer_backlog_jobs", Help: "Rows in staged_jobs.",
		}),
		OldestAge: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "idemd_enqueuer_oldest_staged_age_seconds", Help: "Age of the oldest row in staged_jobs (0 when empty).",
		}),
		Wakeups: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "idemd_enqueuer_wakeups_total", Help: "Drain wake-up signals by cause (notify, poll, reconnect, retry, start), counted even when coalesced into a pending wake-up.",
		}, []string{"cause"}),
		ListenerUp: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "idemd_enqueuer_listener_up", Help: "1 while notifications are known to arrive: the listener is connected and its last self-NOTIFY round trip came back.",
		}),
		PollOnly: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "idemd_enqueuer_poll_only", Help: "1 when the enqueuer does not listen and wakes only every --poll-interval (--poll-only, or --pooler transaction without --listen-database-url).",
		}),
		ListenerCheckFailures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "idemd_enqueuer_listener_check_failures_total", Help: "Self-NOTIFY round trips that did not reach the listener in time (it then reconnects).",
		}),
		NotificationGaps: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "idemd_enqueuer_notification_gaps_total",
			Help: "What notifications failed to report, by reason: swept (rows only the sweep found, below rows already moved, while the listener was up) and notification_without_floor (notifications with no lowest id: migration 00015 missing). Both should stay 0.",
		}, []string{"reason"}),
		SweepDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "idemd_enqueuer_sweep_duration_seconds",
			Help:    "Duration of the sweep's probe for the lowest staged id, every --poll-interval; it grows with the dead rows old snapshots keep in staged_jobs, off the move path.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16),
		}),
	}
	// Every reason starts at 0: increase() over a series that appears at 1
	// is 0, so the first dead-lettered row of a reason would not alert.
	for _, r := range DeadLetterReasons {
		m.DeadLettered.WithLabelValues(r)
	}
	for _, r := range GapReasons {
		m.NotificationGaps.WithLabelValues(r)
	}
	return m
}

// Register adds the collectors to reg.
func (m *Metrics) Register(reg prometheus.Registerer) error {
	for _, c := range []prometheus.Collector{m.Moved, m.DeadLettered, m.BatchDuration, m.BatchErrors, m.Backlog, m.OldestAge, m.Wakeups, m.ListenerUp, m.PollOnly, m.ListenerCheckFailures, m.NotificationGaps, m.SweepDuration} {
		if err := reg.Register(c); err != nil {
			return err
		}
	}
	return nil
}
