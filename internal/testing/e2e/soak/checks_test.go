package soak

import (
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const mib = 1 << 20

// flat is a 30-minute soak sampled every 30 s that keeps every target:
// steady throughput, memory, sessions and table sizes, autovacuum
// running, a young horizon.
func flat() []Sample {
	var out []Sample
	for i := 0; i <= 60; i++ {
		at := time.Duration(i) * 30 * time.Second
		out = append(out, Sample{
			At:           at,
			APIResponses: 200 * at.Seconds(),
			XIDRate:      1000,
			Horizon:      Horizon{Age: 500, Holder: "idemd-reaper"},
			Procs:        map[string]ProcSample{"enqueuer-1": {RSS: 30 * mib}, "reaper": {RSS: 25 * mib}},
			Conns:        map[string]int{"idemd-enqueuer": 4, apiAppName: 10},
			Tables: map[string]TableSample{
				"idempotency_keys": {Total: 20 * mib, Live: 25000, Dead: 2000, Autovacuums: int64(i / 4)},
				"staged_jobs":      {Total: mib, Autovacuums: int64(i / 2)},
				"river_job":        {Total: 50 * mib, Autovacuums: int64(i / 6)},
			},
		})
	}
	return out
}

func failing(checks []Check) []string {
	var names []string
	for _, c := range checks {
		if !c.Pass {
			names = append(names, c.Name)
		}
	}
	return names
}

func TestFlatness(t *testing.T) {
	daemons := []string{"enqueuer-1", "reaper"}
	for _, c := range []struct {
		name   string
		change func([]Sample)
		fail   []string
	}{
		{"flat", func([]Sample) {}, nil},
		{"the horizon pinned", func(s []Sample) {
			for i := range s {
				s[i].Horizon = Horizon{Age: int64(i) * 30_000, Holder: "idemd-enqueuer-listener"}
			}
		}, []string{"xmin horizon age"}},
		{"the API's own snapshot is left out", func(s []Sample) {
			s[40].Horizon = Horizon{Age: 60_000, Holder: apiAppName}
		}, nil},
		{"no autovacuum on staged_jobs", func(s []Sample) {
			for i := range s {
				ts := s[i].Tables["staged_jobs"]
				ts.Autovacuums = 3
				s[i].Tables["staged_jobs"] = ts
			}
		}, []string{"autovacuum on staged_jobs"}},
		{"dead tuples on a sawtooth", func(s []Sample) {
			for i := range s {
				ts := s[i].Tables["idempotency_keys"]
				ts.Dead = int64(i%3) * 4000
				s[i].Tables["idempotency_keys"] = ts
			}
		}, nil},
		{"keys bloat", func(s []Sample) {
			for i := range s {
				ts := s[i].Tables["idempotency_keys"]
				ts.Total = int64(i+1) * mib
				ts.Dead = 5000 + int64(i)*1000
				s[i].Tables["idempotency_keys"] = ts
			}
		}, []string{"idempotency_keys size", "idempotency_keys dead tuples"}},
		{"throughput decays", func(s []Sample) {
			for i := range s {
				if s[i].At > 25*time.Minute {
					s[i].APIResponses = s[50].APIResponses + 150*(s[i].At-25*time.Minute).Seconds()
				}
			}
		}, []string{"API throughput"}},
		{"memory grows", func(s []Sample) {
			for i := range s {
				s[i].Procs["reaper"] = ProcSample{RSS: 25*mib + int64(i)*mib}
			}
		}, []string{"RSS of reaper"}},
		{"a session leaks", func(s []Sample) {
			s[55].Conns = map[string]int{"idemd-enqueuer": 5, apiAppName: 10}
		}, []string{"connections"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := flat()
			c.change(s)
			got := failing(Flatness(s, 30*time.Minute, 8*time.Minute, daemons))
			if strings.Join(got, ",") != strings.Join(c.fail, ",") {
				t.Errorf("failing checks %q, want %q", got, c.fail)
			}
		})
	}
}

// TestMarks: a shorter soak scales the minute marks.
func TestMarks(t *testing.T) {
	if got := mark(3*time.Minute, 8); got != 48*time.Second {
		t.Errorf("minute 8 of a 3-minute soak: %s, want 48s", got)
	}
	s := flat()
	if got := at(s, 95*time.Second).At; got != 2*time.Minute {
		t.Errorf("the sample at 95 s: %s, want the one at 2m0s", got)
	}
	if got := at(s, time.Hour).At; got != 30*time.Minute {
		t.Errorf("past the end: %s, want the last sample", got)
	}
}
