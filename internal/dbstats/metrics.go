package dbstats

import (
	"fmt"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Pass outcomes, the values of the result label of
// idemd_dbstats_passes_total.
const (
	passExported = "exported" // this replica holds the lease and read the stats
	passStandby  = "standby"  // another replica holds the lease
	passError    = "error"    // the lease or a query failed; see the log
)

var passResults = []string{passExported, passStandby, passError}

// snapshot is what the exporter exports: one pass's numbers.
type snapshot struct {
	queues []QueueStats
	// reaperLastSuccess is nil while the reaper's run history has no
	// complete run: the gauge is then absent, never 0.
	reaperLastSuccess *time.Time
	// reaperThrottled is the share of its time the newest reaper run spent
	// throttled; nil while the history has none.
	reaperThrottled *float64
	horizon         *Horizon
}

// metrics holds the counter of passes and the collector of the stats,
// which exports the last pass's numbers only while this replica is the
// exporter: the others export none of them at all.
type metrics struct {
	passes *prometheus.CounterVec

	jobs, oldest, reaperLastSuccess, reaperThrottled, exporter *prometheus.Desc

	// The xmin horizon's holders.
	sessionXIDs, sessionSecs, slotXmin, slotCatalogXmin, prepared, preparedXIDs, preparedSecs, readAllStats *prometheus.Desc

	mu   sync.Mutex
	snap *snapshot // nil: not exporting
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		passes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "idemd_dbstats_passes_total",
			Help: "Passes of the database-wide gauges' exporter by result: exported (this replica holds the db-stats lease), standby (another does), error.",
		}, []string{"result"}),
		jobs: prometheus.NewDesc("idemd_river_jobs",
			"Jobs in river_job by queue and state (available, pending, retryable, running, scheduled), exported by the replica holding the db-stats lease.",
			[]string{"queue", "state"}, nil),
		oldest: prometheus.NewDesc("idemd_river_oldest_available_age_seconds",
			"How long the oldest available job of the queue has been due (0 when none is available), exported by the replica holding the db-stats lease.",
			[]string{"queue"}, nil),
		reaperLastSuccess: prometheus.NewDesc("idemd_reaper_history_last_success_timestamp_seconds",
			"Unix time of the end of the last complete reaper run in the run history (idemd_reaper_runs), whichever process ran it (CronJob, manual, --schedule); exported by the replica holding the db-stats lease, absent while the history has no complete run.",
			nil, nil),
		reaperThrottled: prometheus.NewDesc("idemd_reaper_history_last_run_throttled_ratio",
			"Share (0 to 1) of its time the newest reaper run that took the lease spent waiting for its throttle (replica lag, load, an operator's pause), so far while it runs; from the run history, exported by the replica holding the db-stats lease, absent while the history has no such run.",
			nil, nil),
		exporter: prometheus.NewDesc("idemd_dbstats_exporter",
			"1 when this replica holds the db-stats lease and exports the database-wide gauges (idemd_river_*, idemd_reaper_history_*, idemd_db_*), 0 otherwise.",
			nil, nil),
		sessionXIDs: prometheus.NewDesc("idemd_db_session_xmin_age_transactions",
			fmt.Sprintf("Age in transactions of the oldest snapshot or transaction id held by a session of the database, for the oldest session of each application_name (at most %d names, the oldest); exported by the replica holding the db-stats lease.", MaxSessionHolders),
			[]string{"application_name"}, nil),
		sessionSecs: prometheus.NewDesc("idemd_db_session_xmin_age_seconds",
			"How long the session of idemd_db_session_xmin_age_transactions has been in its transaction (connected, for one without a transaction); absent when the role may not read it (no pg_read_all_stats).",
			[]string{"application_name"}, nil),
		slotXmin: prometheus.NewDesc("idemd_db_replication_slot_xmin_age_transactions",
			"Age in transactions of a replication slot's xmin (a standby's hot_standby_feedback), for each slot holding one; exported by the replica holding the db-stats lease.",
			[]string{"slot_name"}, nil),
		slotCatalogXmin: prometheus.NewDesc("idemd_db_replication_slot_catalog_xmin_age_transactions",
			"Age in transactions of a replication slot's catalog_xmin (a logical slot), for each slot holding one; exported by the replica holding the db-stats lease.",
			[]string{"slot_name"}, nil),
		prepared: prometheus.NewDesc("idemd_db_prepared_transactions",
			"Prepared transactions (PREPARE TRANSACTION) of the database not yet committed or rolled back; exported by the replica holding the db-stats lease.",
			nil, nil),
		preparedXIDs: prometheus.NewDesc("idemd_db_prepared_transaction_oldest_age_transactions",
			"Age in transactions of the oldest prepared transaction; absent when there is none.",
			nil, nil),
		preparedSecs: prometheus.NewDesc("idemd_db_prepared_transaction_oldest_age_seconds",
			"How long ago the oldest prepared transaction was prepared; absent when there is none.",
			nil, nil),
		readAllStats: prometheus.NewDesc("idemd_dbstats_read_all_stats",
			"1 when the exporter's database role may read every session's times in pg_stat_activity (pg_read_all_stats), 0 when other roles' sessions are exported by their age in transactions only; exported by the replica holding the db-stats lease.",
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
func (m *metrics) set(snap *snapshot) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.snap = snap
}

// Describe implements prometheus.Collector.
func (m *metrics) Describe(ch chan<- *prometheus.Desc) {
	ch <- m.jobs
	ch <- m.oldest
	ch <- m.reaperLastSuccess
	ch <- m.reaperThrottled
	ch <- m.exporter
	for _, d := range []*prometheus.Desc{m.sessionXIDs, m.sessionSecs, m.slotXmin, m.slotCatalogXmin, m.prepared, m.preparedXIDs, m.preparedSecs, m.readAllStats} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (m *metrics) Collect(ch chan<- prometheus.Metric) {
	m.mu.Lock()
	defer m.mu.Unlock()
	exporting := 0.0
	if m.snap != nil {
		exporting = 1
	}
	ch <- prometheus.MustNewConstMetric(m.exporter, prometheus.GaugeValue, exporting)
	if m.snap == nil {
		return
	}
	for _, q := range m.snap.queues {
		for _, st := range States {
			ch <- prometheus.MustNewConstMetric(m.jobs, prometheus.GaugeValue, float64(q.Jobs[st]), q.Queue, st)
		}
		ch <- prometheus.MustNewConstMetric(m.oldest, prometheus.GaugeValue, q.OldestAvailableAge.Seconds(), q.Queue)
	}
	if t := m.snap.reaperLastSuccess; t != nil {
		ch <- prometheus.MustNewConstMetric(m.reaperLastSuccess, prometheus.GaugeValue, float64(t.UnixNano())/1e9)
	}
	if r := m.snap.reaperThrottled; r != nil {
		ch <- prometheus.MustNewConstMetric(m.reaperThrottled, prometheus.GaugeValue, *r)
	}
	if h := m.snap.horizon; h != nil {
		m.collectHorizon(ch, h)
	}
}

// collectHorizon exports one pass's holders of the xmin horizon. The
// series are the pass's holders only: a holder that ended is gone at the
// next pass, not left at its last age.
func (m *metrics) collectHorizon(ch chan<- prometheus.Metric, h *Horizon) {
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	gauge(m.readAllStats, boolFloat(h.ReadAllStats))
	for _, s := range h.Sessions {
		gauge(m.sessionXIDs, float64(s.AgeXIDs), s.ApplicationName)
		if s.Age != nil {
			gauge(m.sessionSecs, s.Age.Seconds(), s.ApplicationName)
		}
	}
	for _, s := range h.Slots {
		if s.XminAgeXIDs != nil {
			gauge(m.slotXmin, float64(*s.XminAgeXIDs), s.Name)
		}
		if s.CatalogXminAgeXIDs != nil {
			gauge(m.slotCatalogXmin, float64(*s.CatalogXminAgeXIDs), s.Name)
		}
	}
	gauge(m.prepared, float64(h.Prepared.Count))
	if x := h.Prepared.OldestAgeXIDs; x != nil {
		gauge(m.preparedXIDs, float64(*x))
	}
	if a := h.Prepared.OldestAge; a != nil {
		gauge(m.preparedSecs, a.Seconds())
	}
}

func boolFloat(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
