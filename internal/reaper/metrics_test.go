package reaper

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemd/idemd/internal/review"
)

// A fresh process exports every run result and flag reason at 0 (so the
// first event of a value is an increase the alerts see) and no last-success
// time at all (0 would read as "last success in 1970" and trip
// IdemdReaperNotSucceeding after every restart), nor ever the run
// history's, which internal/dbstats exports.
func TestFreshMetrics(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	m, err := newMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	fams := gatherValues(t, reg)

	wantZero := func(name string, values []string) {
		t.Helper()
		got := fams[name]
		for _, v := range values {
			if c, ok := got[v]; !ok {
				t.Errorf("%s{%q} is not exported by a fresh process", name, v)
			} else if c != 0 {
				t.Errorf("%s{%q} starts at %v, want 0", name, v, c)
			}
		}
		if len(got) != len(values) {
			t.Errorf("%s exports %v, want exactly %v", name, got, values)
		}
	}
	wantZero("idemd_reaper_runs_total", []string{"complete", "incomplete", "lock_held", "dry_run", "error"})
	wantZero("idemd_reaper_keys_flagged_total", review.Reasons())

	const last = "idemd_reaper_last_success_timestamp_seconds"
	if got, ok := fams[last]; ok {
		t.Errorf("%s is exported before any run succeeded: %v", last, got)
	}
	const history = "idemd_reaper_history_last_success_timestamp_seconds"
	if got, ok := fams[history]; ok {
		t.Errorf("%s is exported by the reaper: %v", history, got)
	}
	m.lastSuccess.SetToCurrentTime()
	if got := gatherValues(t, reg)[last]; len(got) != 1 || got[""] <= 0 {
		t.Errorf("%s after a success: %v, want one positive sample", last, got)
	}
}

// gatherValues returns each metric's samples keyed by the value of its one
// label ("" without labels): counters' and gauges' values.
func gatherValues(t *testing.T, reg *prometheus.Registry) map[string]map[string]float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]map[string]float64{}
	for _, mf := range mfs {
		vals := map[string]float64{}
		for _, s := range mf.GetMetric() {
			key := ""
			if ls := s.GetLabel(); len(ls) == 1 {
				key = ls[0].GetValue()
			}
			vals[key] = s.GetCounter().GetValue() + s.GetGauge().GetValue()
		}
		out[mf.GetName()] = vals
	}
	return out
}
