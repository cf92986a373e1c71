package reaper

import "github.com/prometheus/client_golang/prometheus"

// unsetGauge is a gauge that exports nothing until it is first set.
// idemd_reaper_last_success_timestamp_seconds uses it: a plain gauge would
// read 0 ("last success in 1970") on every fresh process, and an alert on
// its age would fire after each restart. Absent until the first complete
// run, the alert falls back to how long the reaper has been up instead
// (IdemdReaperNotSucceeding in deploy/observability/prometheusrule.yaml).
type unsetGauge struct {
	// A vector without labels has exactly one child, created on first use;
	// until then Collect yields nothing.
	vec *prometheus.GaugeVec
}

func newUnsetGauge(opts prometheus.GaugeOpts) *unsetGauge {
	return &unsetGauge{vec: prometheus.NewGaugeVec(opts, nil)}
}

// SetToCurrentTime sets the gauge to the current Unix time, exporting it
// from now on.
func (g *unsetGauge) SetToCurrentTime() { g.vec.WithLabelValues().SetToCurrentTime() }

// Set sets the gauge to v, exporting it from now on.
func (g *unsetGauge) Set(v float64) { g.vec.WithLabelValues().Set(v) }

// Describe implements prometheus.Collector.
func (g *unsetGauge) Describe(ch chan<- *prometheus.Desc) { g.vec.Describe(ch) }

// Collect implements prometheus.Collector.
func (g *unsetGauge) Collect(ch chan<- prometheus.Metric) { g.vec.Collect(ch) }
