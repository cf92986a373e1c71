package throttle

import (
	"context"
	"errors"
	"testing"

	"github.com/idemd/idemd/internal/testing/dbtest"
)

func TestMain(m *testing.M) { dbtest.Main(m) }

// On a server without replicas, as the runtime role: no replica and no
// lag; the WAL rate is known from the second reading on; the probe times a
// commit, and a round's probes give a median and a slowest.
func TestReadWithoutReplicas(t *testing.T) {
	ctx := context.Background()
	pool := dbtest.NewPool(t)
	r := &Reader{Primary: pool, WatchReplicas: true, ProbeCommit: true}
	first := r.Read(ctx)
	if first.Err != nil || first.Replicas != 0 || first.Lag != 0 || first.LagBytes != 0 || first.HasWALRate || first.CommitLatency <= 0 {
		t.Fatalf("first reading: %+v", first)
	}
	// The probe's own commit writes WAL, so the second reading sees some.
	second := r.Read(ctx)
	if second.Err != nil || !second.HasWALRate || second.WALRate <= 0 {
		t.Fatalf("second reading: %+v", second)
	}
	// A round that ends at once still has its first probe and the one
	// after its end.
	if p := r.ProbeRound(ctx)(); p.N < 2 || p.Median <= 0 || p.Worst < p.Median {
		t.Fatalf("a round's probes %+v", p)
	}
	off := &Reader{Primary: pool}
	if p := off.ProbeRound(ctx)(); p != (RoundProbes{}) {
		t.Fatalf("ProbeRound without ProbeCommit measured %+v", p)
	}
	if s := off.Read(ctx); s.CommitLatency != 0 || s.Err != nil {
		t.Fatalf("reading without ProbeCommit: %+v", s)
	}
}

// A replica URL that is not a standby is refused, not read as lag 0.
func TestReadReplicaNotInRecovery(t *testing.T) {
	ctx := context.Background()
	pool := dbtest.NewPool(t)
	r := &Reader{Primary: pool, Replicas: []Replica{{Name: "primary:5432", Pool: pool}}}
	s := r.Read(ctx)
	if s.Err == nil || errors.Is(s.Err, ErrHiddenReplicas) {
		t.Fatalf("a primary given as a replica: %+v", s)
	}
}
