package riverstats

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

// Pass outcomes, the values of the result label of
// idemd_river_stats_passes_total.
const (
	passExported = "exported" // this replica holds the lease and counted
	passStandby  = "standby"  // another replica holds the lease
	passError    = "error"    // the lease or the count failed; see the log
)

var passResults = []string{passExported, passStandby, passError}

// metrics holds the counter of passes and the collector of the stats,
// which exports the last pass's numbers only while this replica is the
// exporter: the others export no idemd_river_jobs series at all.
type metrics struct {
	passes *prometheus.CounterVec

	jobs, oldest, exporter *prometheus.Desc

	mu    sync.Mutex
	stats []QueueStats // nil: not exporting
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		passes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "idemd_river_stats_passes_total",
			Help: "River stats passes by result: exported (this replica holds the river-stats lease), standby (another does), error.",
		}, []string{"result"}),
		jobs: prometheus.NewDesc("idemd_river_jobs",
			"Jobs in river_job by queue and state (available, pending, retryable, running, scheduled), exported by the replica holding the river-stats lease.",
			[]string{"queue", "state"}, nil),
		oldest: prometheus.NewDesc("idemd_river_oldest_available_age_seconds",
			"How long the oldest available job of the queue has been due (0 when none is available), exported by the replica holding the river-stats lease.",
			[]string{"queue"}, nil),
		exporter: prometheus.NewDesc("idemd_river_stats_exporter",
			"1 when this replica holds the river-stats lease and exports idemd_river_jobs, 0 otherwise.",
			nil, nil),
	}
	// Every result starts at 0, so the first error is an increase.
	for _, r := range passResults {
		m.passes.WithLabelValues(r)
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{m.passes, m} {
			if err := reg.Register(c); err != nil {
				return nil, err
			}
		}
	}
	return m, nil
}

// set replaces the exported numbers; nil stops exporting them.
func (m *metrics) set(stats []QueueStats) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.stats = stats
}

// Describe implements prometheus.Collector.
func (m *metrics) Describe(ch chan<- *prometheus.Desc) {
	ch <- m.jobs
	ch <- m.oldest
	ch <- m.exporter
}

// Collect implements prometheus.Collector.
func (m *metrics) Collect(ch chan<- prometheus.Metric) {
	m.mu.Lock()
	defer m.mu.Unlock()
	exporting := 0.0
	if m.stats != nil {
		exporting = 1
	}
	ch <- prometheus.MustNewConstMetric(m.exporter, prometheus.GaugeValue, exporting)
	for _, q := range m.stats {
		for _, st := range States {
			ch <- prometheus.MustNewConstMetric(m.jobs, prometheus.GaugeValue, float64(q.Jobs[st]), q.Queue, st)
		}
		ch <- prometheus.MustNewConstMetric(m.oldest, prometheus.GaugeValue, q.OldestAvailableAge.Seconds(), q.Queue)
	}
}
