package ctl_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"idemd/internal/ctl"
	"idemd/internal/reaper"
)

// TestStatusCountsWhatTheReaperWouldDelete: status counts keys past
// retention by the reaper's own rules (a key in flight or leased by the
// completer is not one a run deletes), with the reaper's defaults, and a
// real run then deletes and flags exactly what status said.
func TestStatusCountsWhatTheReaperWouldDelete(t *testing.T) {
	url, pool := setup(t)
	ctx := context.Background()
	addKey(t, pool, "old-finished", "finished", "73 hours")
	addKey(t, pool, "old-unfinished", "started", "100 hours")
	addKey(t, pool, "young", "started", "71 hours")
	inFlight := addKey(t, pool, "old-in-flight", "started", "80 hours")
	leased := addKey(t, pool, "old-leased", "started", "90 hours")
	if _, err := pool.Exec(ctx, `UPDATE idempotency_keys SET locked_at = now() - interval '5 minutes' WHERE id = $1`, inFlight); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `UPDATE idempotency_keys SET completer_leased_until = now() + interval '1 hour' WHERE id = $1`, leased); err != nil {
		t.Fatal(err)
	}

	status := func(args ...string) ctl.Status {
		t.Helper()
		code, out, errs := run(t, append([]string{"--database-url", url, "status", "--format", "json"}, args...)...)
		if code != 0 {
			t.Fatalf("exit %d: %s", code, errs)
		}
		var st ctl.Status
		if err := json.Unmarshal([]byte(out), &st); err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
		return st
	}
	st := status()
	def := reaper.DefaultSettings()
	if st.Retention != def.Retention.String() || st.LockWindow != def.LockWindow.String() {
		t.Errorf("status counts with retention %s and lock window %s, want the reaper's defaults %s and %s", st.Retention, st.LockWindow, def.Retention, def.LockWindow)
	}
	if st.KeysPastRetention != 2 || st.KeysToFlag != 1 || st.OldestKeyPastRetention == nil {
		t.Fatalf("status: %d keys past retention, %d to flag, oldest %v; want 2 and 1 (not the key in flight, not the leased one)",
			st.KeysPastRetention, st.KeysToFlag, st.OldestKeyPastRetention)
	}
	// A lock older than --lock-window is abandoned: the reaper deletes
	// that key, and status counts it.
	if st := status("--lock-window", "1m"); st.KeysPastRetention != 3 || st.KeysToFlag != 2 {
		t.Fatalf("status --lock-window 1m: %d past retention, %d to flag; want 3 and 2", st.KeysPastRetention, st.KeysToFlag)
	}

	// The oracle: a run with the same settings.
	svc, err := reaper.New(reaper.Config{Settings: def, Pool: pool, Registry: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	res, err := svc.RunOnce(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if res.Deleted != st.KeysPastRetention || res.Flagged != st.KeysToFlag {
		t.Fatalf("the run deleted %d and flagged %d; status said %d and %d", res.Deleted, res.Flagged, st.KeysPastRetention, st.KeysToFlag)
	}
	if st := status(); st.KeysPastRetention != 0 || st.OldestKeyPastRetention != nil {
		t.Fatalf("after the run status still counts %d keys past retention", st.KeysPastRetention)
	}
}

// TestStatusRefusesWhatTheReaperRefuses: status's --retention follows the
// reaper's rule (at least 1h), exit 2.
func TestStatusRefusesWhatTheReaperRefuses(t *testing.T) {
	url, _ := setup(t)
	code, _, errs := run(t, "--database-url", url, "status", "--retention", "10m")
	if code != 2 || !strings.Contains(errs, "--retention") {
		t.Fatalf("exit %d: %s", code, errs)
	}
}
