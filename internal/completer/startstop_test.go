package completer

import (
	"strings"
	"testing"

	"github.com/idemd/idemd/internal/opshttp"
	"github.com/idemd/idemd/internal/testing/dbtest"
	"github.com/idemd/idemd/internal/testing/startstoptest"
)

// TestStartStopStress: Start and Stop called from several goroutines at
// once, over and over, neither panic nor hang nor race (run with -race),
// and after the last Stop no goroutine of the completer's passes and its gauges loop is left.
func TestStartStopStress(t *testing.T) {
	pool := dbtest.NewPool(t)
	// Keys to replay, so the stress stops passes that are working.
	insertKeys(t, pool, "stress", 200, "started")
	api := newTestAPI(t, pool, func(string, int) action { return actFinish })
	ready := &opshttp.Readiness{}
	cfg := testConfig(api.srv.URL)
	cfg.Ready = ready
	svc := newTestService(t, pool, cfg)
	startstoptest.Stress(t, svc, startstoptest.Options{
		AlreadyStarted: func(err error) bool { return strings.Contains(err.Error(), "already started") },
		Packages:       []string{"github.com/idemd/idemd/internal/completer", "github.com/idemd/idemd/internal/lifecycle"},
	})
}
