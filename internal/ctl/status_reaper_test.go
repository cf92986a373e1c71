package ctl_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemd/idemd/internal/ctl"
	"github.com/idemd/idemd/internal/reaper"
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
		return statusJSON(t, url, args...)
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

// TestStatusShowsTheReaperRuns: status lists the reaper's last runs, newest
// first, in both outputs: a complete run, a failed one with its error, one
// killed (no end, its holder's lease gone) as interrupted, one whose holder
// holds a live lease as running; and when the last complete run ended.
func TestStatusShowsTheReaperRuns(t *testing.T) {
	url, pool := setup(t)
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `
INSERT INTO idemd_reaper_runs (started_at, finished_at, mode, result, deleted, flagged, error, holder) VALUES
    (now() - interval '4 hours', now() - interval '4 hours' + interval '3 seconds', 'once', 'complete', 30, 10, NULL, 'reaper/pod-a/1/aa'),
    (now() - interval '3 hours', now() - interval '3 hours' + interval '1 second', 'once', 'error', 0, 0, 'reaper: more than 9 keys are past retention, the --max-deletes cap', 'reaper/pod-b/1/bb'),
    (now() - interval '2 hours', NULL, 'once', NULL, 20, 4, NULL, 'reaper/pod-c/1/cc'),
    (now() - interval '1 minute', NULL, 'schedule', NULL, 5, 0, NULL, 'reaper/pod-d/1/dd');
INSERT INTO idemd_leases (name, holder, acquired_at, renewed_at, expires_at)
VALUES ('reaper', 'reaper/pod-d/1/dd', now(), now(), now() + interval '1 hour')`); err != nil {
		t.Fatal(err)
	}
	var lastComplete time.Time
	if err := pool.QueryRow(ctx, `SELECT finished_at FROM idemd_reaper_runs WHERE result = 'complete'`).Scan(&lastComplete); err != nil {
		t.Fatal(err)
	}

	st := statusJSON(t, url)
	var got []string
	for _, r := range st.ReaperRuns {
		got = append(got, fmt.Sprintf("%s %s %d/%d", r.Mode, r.Result, r.Deleted, r.Flagged))
	}
	want := []string{"schedule running 5/0", "once interrupted 20/4", "once error 0/0", "once complete 30/10"}
	if strings.Join(got, ", ") != strings.Join(want, ", ") {
		t.Fatalf("reaper runs %v, want %v", got, want)
	}
	if !strings.Contains(st.ReaperRuns[2].Error, "--max-deletes") {
		t.Errorf("the failed run's error is missing: %+v", st.ReaperRuns[2])
	}
	if st.LastReaperSuccess == nil || !st.LastReaperSuccess.Equal(lastComplete) {
		t.Errorf("last reaper success %v, want %v", st.LastReaperSuccess, lastComplete)
	}

	code, out, errs := run(t, "--database-url", url, "status")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	lines := strings.Split(out, "\n")
	find := func(prefix string) string {
		for _, l := range lines {
			if strings.HasPrefix(strings.TrimSpace(l), prefix) {
				return strings.Join(strings.Fields(l), " ")
			}
		}
		t.Fatalf("no line %q in:\n%s", prefix, out)
		return ""
	}
	for i, r := range st.ReaperRuns {
		line := find(fmt.Sprintf("run %d (%s)", r.ID, r.Mode))
		if !strings.Contains(line, " "+strings.Fields(want[i])[1]+" ") || !strings.Contains(line, fmt.Sprintf("deleted %d, flagged %d", r.Deleted, r.Flagged)) {
			t.Errorf("run line %q does not say %s", line, want[i])
		}
	}
	if line := find("run " + fmt.Sprint(st.ReaperRuns[2].ID)); !strings.Contains(line, "--max-deletes cap") {
		t.Errorf("the failed run's line lacks its error: %q", line)
	}
	if line := find("last complete run"); !strings.Contains(line, "3h59m ago") {
		t.Errorf("last complete run line %q, want 3h59m ago (the run ended 3 s after its start 4 h ago)", line)
	}
}

// TestStatusSaysWhenRetentionIsTheDefault: status counts keys past
// retention by the reaper's default unless given the reaper's setting, and
// its text says so where the count is read; given the setting (flag or
// IDEMD_RETENTION), it does not.
func TestStatusSaysWhenRetentionIsTheDefault(t *testing.T) {
	url, _ := setup(t)
	const note = "--retention is the reaper's default here"
	t.Setenv("IDEMD_RETENTION", "")
	if err := os.Unsetenv("IDEMD_RETENTION"); err != nil {
		t.Fatal(err)
	}
	if code, out, errs := run(t, "--database-url", url, "status"); code != 0 || !strings.Contains(out, note) {
		t.Errorf("status at the default: exit %d, want the note\n%s%s", code, out, errs)
	}
	if code, out, errs := run(t, "--database-url", url, "status", "--retention", "168h"); code != 0 || strings.Contains(out, note) || !strings.Contains(out, "retention 168h") {
		t.Errorf("status --retention 168h: exit %d, want no note\n%s%s", code, out, errs)
	}
	t.Setenv("IDEMD_RETENTION", "96h")
	if code, out, errs := run(t, "--database-url", url, "status"); code != 0 || strings.Contains(out, note) || !strings.Contains(out, "retention 96h") {
		t.Errorf("status with IDEMD_RETENTION: exit %d, want no note\n%s%s", code, out, errs)
	}
}

// TestStatusCountsByTheRecordedRetention: status counts keys past
// retention by the retention and lock window the newest reaper run
// recorded, given no flag; before any run recorded them (and after a dry
// run, which records nothing) it counts by its own flags and says so.
func TestStatusCountsByTheRecordedRetention(t *testing.T) {
	url, pool := setup(t)
	ctx := context.Background()
	t.Setenv("IDEMD_RETENTION", "")
	if err := os.Unsetenv("IDEMD_RETENTION"); err != nil {
		t.Fatal(err)
	}
	status := func() ctl.Status {
		t.Helper()
		return statusJSON(t, url)
	}
	reap := func(dryRun bool) *reaper.Result {
		t.Helper()
		set := reaper.DefaultSettings()
		set.Retention, set.LockWindow, set.DryRun = time.Hour, 2*time.Minute, dryRun
		svc, err := reaper.New(reaper.Config{Settings: set, Pool: pool, Registry: prometheus.NewRegistry()})
		if err != nil {
			t.Fatal(err)
		}
		res, err := svc.RunOnce(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	const fallback = "no reaper run recorded its retention and lock window"
	addKey(t, pool, "two-hours", "finished", "2 hours")

	for _, when := range []string{"before any run", "after a dry run"} {
		if when == "after a dry run" {
			reap(true)
		}
		st := status()
		if st.SettingsFromRun != nil || !strings.Contains(st.SettingsNote, fallback) || st.Retention != "72h0m0s" || st.KeysPastRetention != 0 {
			t.Fatalf("status %s: retention %s from run %v (%q), %d keys past it; want the default 72h, said so, and none",
				when, st.Retention, st.SettingsFromRun, st.SettingsNote, st.KeysPastRetention)
		}
		if code, out, errs := run(t, "--database-url", url, "status"); code != 0 || !strings.Contains(out, fallback) || !strings.Contains(out, "retention 72h0m0s") {
			t.Fatalf("status %s: exit %d, want the fallback said\n%s%s", when, code, out, errs)
		}
	}

	if res := reap(false); res.Deleted != 1 {
		t.Fatalf("the run at --retention 1h deleted %d keys, want the two-hours one", res.Deleted)
	}
	// Past 1h: one finished, one whose lock is older than the run's 2m lock
	// window but younger than the default 1h; and one within 1h.
	addKey(t, pool, "two-hours-again", "finished", "2 hours")
	locked := addKey(t, pool, "two-hours-locked", "started", "2 hours")
	addKey(t, pool, "half-hour", "finished", "30 minutes")
	if _, err := pool.Exec(ctx, `UPDATE idempotency_keys SET locked_at = now() - interval '5 minutes' WHERE id = $1`, locked); err != nil {
		t.Fatal(err)
	}
	st := status()
	if len(st.ReaperRuns) != 1 {
		t.Fatalf("%d runs in the history, want the one run (the dry run is not recorded)", len(st.ReaperRuns))
	}
	if st.SettingsFromRun == nil || *st.SettingsFromRun != st.ReaperRuns[0].ID || st.SettingsNote != "" ||
		st.Retention != "1h0m0s" || st.LockWindow != "2m0s" || st.KeysPastRetention != 2 || st.KeysToFlag != 1 {
		t.Fatalf("status after the run: retention %s, lock window %s from run %v (%q), %d keys past it, %d to flag; want run %d's 1h and 2m, 2 and 1",
			st.Retention, st.LockWindow, st.SettingsFromRun, st.SettingsNote, st.KeysPastRetention, st.KeysToFlag, st.ReaperRuns[0].ID)
	}
	want := fmt.Sprintf("retention 1h0m0s, lock window 2m0s, as reaper run %d recorded", st.ReaperRuns[0].ID)
	if code, out, errs := run(t, "--database-url", url, "status"); code != 0 || !strings.Contains(out, want) || strings.Contains(out, fallback) {
		t.Fatalf("status after the run: exit %d, want %q and no fallback\n%s%s", code, want, out, errs)
	}
}
