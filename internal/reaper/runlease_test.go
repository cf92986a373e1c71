package reaper

import (
	"testing"
	"time"

	"github.com/idemd/idemd/internal/lease"
)

// TestLeaseWaitVerdicts: the rule that tells a live run from the lease of
// a dead one, without a database.
func TestLeaseWaitVerdicts(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	held := func(holder string, renewed time.Time) lease.Attempt {
		return lease.Attempt{PrevHolder: holder, PrevRenewed: renewed}
	}
	for _, tc := range []struct {
		name     string
		attempts []lease.Attempt
		want     []verdict
	}{
		{"free", []lease.Attempt{{Acquired: true}}, []verdict{verdictAcquired}},
		{"holder in a batch", []lease.Attempt{{Busy: true}}, []verdict{verdictLive}},
		// Renewed a moment ago but never again: killed just after; wait
		// for the expiry, then take it.
		{"recently renewed, then silent", []lease.Attempt{held("a", t0), held("a", t0), {Acquired: true, PrevHolder: "a", PrevRenewed: t0}},
			[]verdict{verdictWait, verdictWait, verdictAcquired}},
		{"seen renewing", []lease.Attempt{held("a", t0), held("a", t0.Add(time.Second))}, []verdict{verdictWait, verdictLive}},
		{"another run took it", []lease.Attempt{held("a", t0), held("b", t0)}, []verdict{verdictWait, verdictLive}},
		{"released between read and upsert", []lease.Attempt{{}, {Acquired: true}}, []verdict{verdictWait, verdictAcquired}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := &leaseWait{}
			for i, a := range tc.attempts {
				if got := w.next(a); got != tc.want[i] {
					t.Fatalf("attempt %d (%+v): verdict %d, want %d", i, a, got, tc.want[i])
				}
			}
		})
	}
}
