package dbstats

import (
	"strings"
	"testing"
	"time"

	"github.com/idemd/idemd/internal/testing/dbtest"
	"github.com/idemd/idemd/internal/testing/startstoptest"
)

// TestStartStopStress: Start and Stop called from several goroutines at
// once, over and over, neither panic nor hang nor race (run with -race),
// and after the last Stop no goroutine of the exporter's passes is left.
//
// Not parallel: it counts the goroutines of the package's functions left
// after the last Stop, and a parallel test's exporter would be counted.
// Go runs it before the package's parallel tests start.
func TestStartStopStress(t *testing.T) {
	pool := dbtest.NewPool(t)
	insertJobs(t, pool, job{"default", "available", time.Now()})
	svc, _ := newService(t, pool, testSettings())
	startstoptest.Stress(t, svc, startstoptest.Options{
		AlreadyStarted: func(err error) bool { return strings.Contains(err.Error(), "already started") },
		Packages:       []string{"github.com/idemd/idemd/internal/dbstats", "github.com/idemd/idemd/internal/lifecycle"},
	})
}
