package enqueuer

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/idemd/idemd/internal/testing/dbtest"
)

// TestListenerCheckIsNotStarvedByOtherReplicas: other replicas' self-check
// NOTIFYs keep arriving on the channel (here a stream of them, as from a
// crowd of replicas) while this replica checks its listener every few
// milliseconds. Its own check must come back every time: twenty round
// trips in a row on one connection, no failed check, the listener up
// throughout. (A listener that hands check payloads to the checker
// through a one-slot channel, dropping what does not fit, fails this:
// another replica's payload in the slot makes this replica drop its own,
// time out, and reconnect with listener_up 0.)
func TestListenerCheckIsNotStarvedByOtherReplicas(t *testing.T) {
	pool := dbtest.NewPool(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	others, err := pgx.ConnectConfig(ctx, pool.Config().ConnConfig.Copy())
	if err != nil {
		t.Fatal(err)
	}
	defer others.Close(context.Background())
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	wg.Go(func() {
		for i := 0; ctx.Err() == nil; i++ {
			payload := fmt.Sprintf("%senqueuer/other-replica-%d/1/cafe:%d", listenerCheckPrefix, i%3, i)
			if _, err := others.Exec(ctx, "SELECT pg_notify($1, $2)", NotifyChannel, payload); err != nil && ctx.Err() == nil {
				t.Errorf("another replica's check: %v", err)
				return
			}
		}
	})

	s := newService(t, pool, func(s *Settings) { s.ListenerCheckInterval = time.Millisecond })
	s.signals.listenerChecked.Init(t)
	if err := s.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer s.Stop(context.Background()) //nolint:errcheck
	for want := range 20 {
		// A failed check reconnects, and the new connection counts from 0.
		if seq := s.signals.listenerChecked.WaitOrTimeout(t); seq != want {
			t.Fatalf("check %d came back as check %d of a new connection: a check failed (%v failures)",
				want, seq, testutil.ToFloat64(s.metrics.listenerCheckFailures))
		}
	}
	if n := testutil.ToFloat64(s.metrics.listenerCheckFailures); n != 0 {
		t.Fatalf("%v failed self-checks", n)
	}
	if up := testutil.ToFloat64(s.metrics.listenerUp); up != 1 {
		t.Fatalf("listener_up %v", up)
	}
}

// selfCheck, without a database: only the expected payload closes the
// checker's channel, whatever else is heard before or after it.
func TestSelfCheckMatchesItsOwnPayload(t *testing.T) {
	closed := func(c <-chan struct{}) bool {
		select {
		case <-c:
			return true
		default:
			return false
		}
	}
	var c selfCheck
	c.heard(listenerCheckPrefix + "us:0") // nothing expected yet
	came := c.expect(listenerCheckPrefix + "us:1")
	for i := range 1000 {
		c.heard(fmt.Sprintf("%sother-%d:%d", listenerCheckPrefix, i%7, i))
	}
	c.heard(listenerCheckPrefix + "us:0") // an earlier one of ours
	if closed(came) {
		t.Fatal("another payload was taken for ours")
	}
	c.heard(listenerCheckPrefix + "us:1")
	if !closed(came) {
		t.Fatal("our payload, heard after a thousand others, was not matched")
	}
	c.heard(listenerCheckPrefix + "us:1") // heard twice: no second close
	next := c.expect(listenerCheckPrefix + "us:2")
	c.heard(listenerCheckPrefix + "us:1")
	if closed(next) {
		t.Fatal("the previous check's payload matched the next check")
	}
}
