package enqueuer

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemd/idemd/internal/riverdb"
)

// A fresh process exports every dead-letter reason at 0, so the alert's
// increase() sees the first dead-lettered row of any reason.
func TestDeadLetteredReasonsStartAtZero(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	if _, err := newMetrics(reg); err != nil {
		t.Fatal(err)
	}
	got := gatheredLabelValues(t, reg, "idemd_enqueuer_jobs_dead_lettered_total", "reason")
	if len(got) != len(riverdb.DeadLetterReasons) {
		t.Errorf("fresh registry exports reasons %v, want %v", got, riverdb.DeadLetterReasons)
	}
	for _, r := range riverdb.DeadLetterReasons {
		v, ok := got[r]
		if !ok {
			t.Errorf("reason %q is not exported on a fresh registry", r)
		} else if v != 0 {
			t.Errorf("reason %q starts at %v, want 0", r, v)
		}
	}
}

// Every wake-up cause and notification gap reason is exported at 0 from
// the start too.
func TestLabelledCountersStartAtZero(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	if _, err := newMetrics(reg); err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string][]string{
		"idemd_enqueuer_wakeups_total":           wakeCauses,
		"idemd_enqueuer_notification_gaps_total": GapReasons,
		"idemd_enqueuer_move_refusals_total":     RefusalCauses,
	} {
		label := "cause"
		if name == "idemd_enqueuer_notification_gaps_total" {
			label = "reason"
		}
		got := gatheredLabelValues(t, reg, name, label)
		if len(got) != len(want) {
			t.Errorf("%s: fresh registry exports %v, want %v", name, got, want)
		}
		for _, v := range want {
			if n, ok := got[v]; !ok || n != 0 {
				t.Errorf("%s{%s=%q}: %v (exported %v), want 0", name, label, v, n, ok)
			}
		}
	}
}

// gatheredLabelValues returns the value of each series of the counter name,
// keyed by its label's value.
func gatheredLabelValues(t *testing.T, reg *prometheus.Registry, name, label string) map[string]float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if lp.GetName() == label {
					out[lp.GetValue()] = m.GetCounter().GetValue()
				}
			}
		}
	}
	return out
}
