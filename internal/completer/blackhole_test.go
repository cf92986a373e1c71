package completer

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/idemd/idemd/internal/dbcall"
	"github.com/idemd/idemd/internal/testing/blackhole"
	"github.com/idemd/idemd/internal/testing/tcpproxy"
	"github.com/idemd/idemd/internal/testing/testwait"
)

// A completer pass on a network that went silent fails within its bound,
// naming the call the database did not answer (its low-water mark),
// instead of blocking; once the network forwards again, the next passes
// claim and finish the keys abandoned meanwhile, on new connections.
func TestPassEndsInABlackHoleAndClaimsAfterIt(t *testing.T) {
	const bound = 300 * time.Millisecond
	direct, pool, hole, calls := blackhole.Database(t, bound)
	api := newTestAPI(t, direct, always(actFinish))
	cfg := testConfig(api.srv.URL)
	cfg.Calls = calls
	svc := newTestService(t, pool, cfg)
	pass := func() (res *Result, err error) {
		testwait.Returns(t, 100*bound, "a completer pass", func() { res, err = svc.RunOnce(context.Background()) })
		return res, err
	}
	if _, err := pass(); err != nil {
		t.Fatal(err)
	}

	hole.BlackHole(tcpproxy.HoleOptions{})
	insertKeys(t, direct, "hole", 3, "started")
	_, err := pass()
	if !dbcall.IsTimeout(err) {
		t.Fatalf("a pass in the black hole returned %v, want a database timeout", err)
	}
	if f := calls.Fault(); f == nil || !strings.Contains(f.Error(), "completer: low-water mark") {
		t.Fatalf("Fault (what /readyz says) = %v, want the completer's low-water mark", f)
	}

	hole.Heal()
	testwait.Until(t, time.Minute, "the keys abandoned during the hole finished", func() bool {
		pass() //nolint:errcheck // a pass may meet a pooled connection the hole silenced
		return countWhere(t, direct, "idempotency_key LIKE 'hole-%' AND recovery_point = 'finished'") == 3
	})
	if f := calls.Fault(); f != nil {
		t.Fatalf("the database answers again but Fault still says %v", f)
	}
	if api.overlaps != 0 {
		t.Fatalf("%d keys replayed twice at once", api.overlaps)
	}
}
