package soak

import (
	"fmt"
	"io"
	"time"
)

// WriteText writes the report for a reader: the run, a line per sample,
// the checks with their values, the oracle and the problems.
func (r *Report) WriteText(w io.Writer) error {
	o := r.Options
	verdict := "PASSED"
	if !r.Passed() {
		verdict = "FAILED"
	}
	p := func(format string, args ...any) { fmt.Fprintf(w, format+"\n", args...) }
	p("idemd soak: %s (took %s)", verdict, r.Took.Round(time.Second))
	p("server: a private cluster, %s", r.Server)
	p("traffic: %s of Rocket Rides, %d closed-loop clients, %.0f %% injected 500s, %.0f %% of rides given up mid-request, fake Stripe latency %s",
		o.Duration, o.Clients, 100*o.FaultRate, 100*o.GiveUpRate, o.StripeLatency)
	p("daemons: 2 enqueuers, 1 completer (%v), reaper --schedule \"@every %s\" --retention %s; a sample every %s", completerArgs, o.ReaperEvery, o.Retention, o.Interval)
	p("clients: %s", r.Traffic)
	p("")
	p("samples (%s):", lineHeader(r.Daemons))
	for _, s := range r.Samples {
		p("  %s", line(s, r.Daemons))
	}
	p("")
	p("checks:")
	for _, c := range r.Checks {
		p("  %s", c)
	}
	for _, v := range r.Snapshot.Violations {
		p("  snapshot held too long: %s", v)
	}
	if r.Snapshot.LastError != nil {
		p("  horizon sampler: %d readings failed, the last: %v", r.Snapshot.Errors, r.Snapshot.LastError)
	}
	p("")
	if r.Oracle != nil {
		verdict := "PASS"
		if !r.Oracle.Passed() {
			verdict = "FAIL"
		}
		p("oracle: %s", verdict)
		for _, n := range r.Oracle.Notes {
			p("  %s", n)
		}
		for _, v := range r.Oracle.Violations {
			p("  VIOLATION %s", v)
		}
	} else {
		p("oracle: not run")
	}
	if len(r.Problems) > 0 {
		p("")
		p("problems:")
		for _, pr := range r.Problems {
			p("  %s", pr)
		}
	}
	return nil
}
