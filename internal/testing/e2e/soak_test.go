//go:build e2e

package e2e

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/idemd/idemd/internal/testing/e2e/soak"
)

// TestSoak is the soak (30 minutes by default): IDEMD_SOAK=1 enables it,
// IDEMD_SOAK_DURATION sets its length (3m for a smoke check). The report
// goes to IDEMD_SOAK_REPORT (default soak-report.txt) and the samples to
// IDEMD_SOAK_SAMPLES (default soak-samples.csv). `make soak` runs it;
// docs/benchmarks/soak.md says how to read it.
func TestSoak(t *testing.T) {
	if os.Getenv("IDEMD_SOAK") != "1" {
		t.Skip("soak skipped: set IDEMD_SOAK=1 to run it (30 minutes; IDEMD_SOAK_DURATION=3m for a smoke check), or run `make soak`")
	}
	d := 30 * time.Minute
	if s := os.Getenv("IDEMD_SOAK_DURATION"); s != "" {
		var err error
		if d, err = time.ParseDuration(s); err != nil {
			t.Fatalf("IDEMD_SOAK_DURATION: %v", err)
		}
	}
	out := os.Getenv("IDEMD_SOAK_REPORT")
	if out == "" {
		out = "soak-report.txt"
	}
	samples := os.Getenv("IDEMD_SOAK_SAMPLES")
	if samples == "" {
		samples = "soak-samples.csv"
	}
	ctx, cancel := context.WithTimeout(context.Background(), d+20*time.Minute)
	defer cancel()
	rep, err := soak.Run(ctx, soak.Options{Duration: d, SamplesPath: samples, Logf: t.Logf})
	if rep != nil {
		f, ferr := os.Create(out)
		if ferr != nil {
			t.Fatal(ferr)
		}
		if werr := rep.WriteText(f); werr != nil {
			t.Error(werr)
		}
		if cerr := f.Close(); cerr != nil {
			t.Error(cerr)
		}
		t.Logf("report: %s, samples: %s", out, samples)
	}
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range rep.Checks {
		if c.Pass {
			t.Log(c)
		} else {
			t.Error(c)
		}
	}
	for _, n := range rep.Oracle.Notes {
		t.Logf("oracle: %s", n)
	}
	for _, v := range rep.Oracle.Violations {
		t.Errorf("oracle: %s", v)
	}
	for _, p := range rep.Problems {
		t.Error(p)
	}
}
