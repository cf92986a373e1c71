package enqueuer

import (
	"strings"
	"testing"

	"github.com/idemd/idemd/internal/opshttp"
	"github.com/idemd/idemd/internal/testing/dbtest"
	"github.com/idemd/idemd/internal/testing/startstoptest"
)

// TestStartStopStress: Start and Stop called from several goroutines at
// once, over and over, neither panic nor hang nor race (run with -race),
// and after the last Stop no goroutine of the enqueuer's main loop, its listener, sweep and gauges loops is left.
func TestStartStopStress(t *testing.T) {
	pool := dbtest.NewPool(t)
	ready := &opshttp.Readiness{}
	svc, err := New(Config{Settings: DefaultSettings(), Pool: pool, Ready: ready})
	if err != nil {
		t.Fatal(err)
	}
	startstoptest.Stress(t, svc, startstoptest.Options{
		AlreadyStarted: func(err error) bool { return strings.Contains(err.Error(), "already started") },
		Packages:       []string{"github.com/idemd/idemd/internal/enqueuer", "github.com/idemd/idemd/internal/lifecycle"},
	})
}
