package reaper

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/idemd/idemd/internal/opshttp"
	"github.com/idemd/idemd/internal/testing/dbtest"
	"github.com/idemd/idemd/internal/testing/startstoptest"
)

// TestStartStopStress: Start and Stop called from several goroutines at
// once, over and over, neither panic nor hang nor race (run with -race),
// and after the last Stop no goroutine of the reaper's scheduled runs is left.
func TestStartStopStress(t *testing.T) {
	pool := dbtest.NewPool(t)
	settings := testSettings()
	settings.Schedule = "@every 1s"
	ready := &opshttp.Readiness{}
	svc, err := New(Config{Settings: settings, Pool: pool, Logger: zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel)), Registry: prometheus.NewRegistry(), Ready: ready})
	if err != nil {
		t.Fatal(err)
	}
	startstoptest.Stress(t, svc, startstoptest.Options{
		AlreadyStarted: func(err error) bool { return strings.Contains(err.Error(), "already started") },
		Packages:       []string{"github.com/idemd/idemd/internal/reaper", "github.com/idemd/idemd/internal/lifecycle"},
	})
}
