package server

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemd/idemd/idem"
)

// The nonce store's failures are exported, by operation, next to its
// deletions.
func TestNonceMetricsRegister(t *testing.T) {
	reg := prometheus.NewRegistry()
	registerNonceMetrics(reg, idem.NewReplayNonces(nil, idem.ReplayNoncesOptions{}))
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]int{}
	for _, mf := range mfs {
		got[mf.GetName()] = len(mf.GetMetric())
	}
	if got["rocketrides_replay_nonce_errors_total"] != 2 || got["rocketrides_replay_nonces_deleted_total"] != 1 {
		t.Fatalf("series by name: %v; want errors_total{op=record,cleanup} and deleted_total", got)
	}
}
