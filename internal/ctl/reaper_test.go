package ctl_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/idemd/idemd/internal/runhistory"
)

// reaper runs lists the history newest first, in text and JSON, and marks a
// run without an end whose holder has no lease as interrupted.
func TestReaperRuns(t *testing.T) {
	url, pool := setup(t)
	ctx := context.Background()
	db := []string{"--database-url", url}

	code, out, errs := run(t, append(db, "reaper", "runs")...)
	if code != 0 || !strings.Contains(out, "no reaper run recorded yet") {
		t.Fatalf("empty history: exit %d\n%s%s", code, out, errs)
	}
	if _, err := pool.Exec(ctx, `
INSERT INTO idemd_reaper_runs (started_at, finished_at, mode, result, deleted, flagged, error, holder) VALUES
  (now() - interval '3 hours', now() - interval '3 hours' + interval '2 seconds', 'once', 'complete', 120, 3, NULL, 'reaper-a'),
  (now() - interval '2 hours', now() - interval '2 hours' + interval '1 second', 'schedule', 'error', 0, 0, 'cap exceeded', 'reaper-b'),
  (now() - interval '1 hour', NULL, 'once', NULL, 40, 1, NULL, 'reaper-killed')`); err != nil {
		t.Fatal(err)
	}

	code, out, errs = run(t, append(db, "reaper", "runs")...)
	if code != 0 {
		t.Fatalf("text: exit %d\n%s%s", code, out, errs)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 4 {
		t.Fatalf("want a header and 3 runs:\n%s", out)
	}
	for i, want := range []string{"interrupted", "cap exceeded", "complete"} { // newest first
		if !strings.Contains(lines[i+1], want) {
			t.Errorf("line %d lacks %q:\n%s", i+1, want, out)
		}
	}

	code, out, errs = run(t, append(db, "reaper", "runs", "-n", "2", "-o", "json")...)
	if code != 0 {
		t.Fatalf("json: exit %d\n%s%s", code, out, errs)
	}
	var runs []runhistory.Run
	if err := json.Unmarshal([]byte(out), &runs); err != nil {
		t.Fatalf("json: %v\n%s", err, out)
	}
	if len(runs) != 2 || runs[0].Holder != "reaper-killed" || runs[0].Result != "interrupted" || runs[0].Deleted != 40 ||
		runs[1].Error != "cap exceeded" {
		t.Fatalf("json runs: %+v", runs)
	}

	if code, _, _ := run(t, append(db, "reaper", "runs", "-n", "0")...); code != 2 {
		t.Fatalf("-n 0: exit %d, want 2", code)
	}
}

// reaper pause and resume: each needs who and why (exit 2 without), refuses
// the wrong state, is recorded in idemd_operator_actions, and reaper runs
// shows the pause in force and the runs' throttled time and stop reason.
func TestReaperPauseResume(t *testing.T) {
	url, pool := setup(t)
	ctx := context.Background()
	db := []string{"--database-url", url}

	if code, _, _ := run(t, append(db, "reaper", "pause", "--by", "alice")...); code != 2 {
		t.Fatalf("pause without --note: exit %d, want 2", code)
	}
	code, out, errs := run(t, append(db, "reaper", "pause", "--by", "alice", "--note", "standby rebuild")...)
	if code != 0 || !strings.Contains(out, "reaper paused by alice") {
		t.Fatalf("pause: exit %d\n%s%s", code, out, errs)
	}
	if code, out, errs := run(t, append(db, "reaper", "pause", "--by", "bob", "--note", "again")...); code != 3 || !strings.Contains(errs, "already paused, by alice") {
		t.Fatalf("second pause: exit %d, want 3 (refused)\n%s%s", code, out, errs)
	}
	if _, err := pool.Exec(ctx, `
INSERT INTO idemd_reaper_runs (started_at, finished_at, mode, result, deleted, flagged, error, holder, throttled_seconds, throttle_reason, stop_reason) VALUES
  (now() - interval '1 hour', now(), 'once', 'incomplete', 5, 0, 'probe commit 300ms over commit_latency=200ms (critical)', 'reaper-a', 2.5, 'replica_lag', 'critical_load')`); err != nil {
		t.Fatal(err)
	}
	code, out, errs = run(t, append(db, "reaper", "runs")...)
	if code != 0 || !strings.Contains(out, "PAUSED by alice") || !strings.Contains(out, "standby rebuild") ||
		!strings.Contains(out, "2.5s replica_lag") || !strings.Contains(out, "critical_load") {
		t.Fatalf("runs while paused: exit %d\n%s%s", code, out, errs)
	}
	code, out, errs = run(t, append(db, "status")...)
	if code != 0 || !strings.Contains(out, "throttled 2.5s replica_lag, stopped by critical_load") {
		t.Fatalf("status: exit %d\n%s%s", code, out, errs)
	}
	code, out, errs = run(t, append(db, "reaper", "resume", "--by", "bob", "--note", "rebuild done")...)
	if code != 0 || !strings.Contains(out, "reaper resumed by bob") || !strings.Contains(out, "paused by alice") {
		t.Fatalf("resume: exit %d\n%s%s", code, out, errs)
	}
	if code, out, errs := run(t, append(db, "reaper", "resume", "--by", "bob", "--note", "again")...); code != 3 || !strings.Contains(errs, "not paused") {
		t.Fatalf("second resume: exit %d, want 3 (refused)\n%s%s", code, out, errs)
	}
	if code, out, _ := run(t, append(db, "reaper", "runs")...); code != 0 || strings.Contains(out, "PAUSED") {
		t.Fatalf("runs after the resume: exit %d\n%s", code, out)
	}
	var actions string
	if err := pool.QueryRow(ctx, `SELECT string_agg(actor || ':' || action || ':' || via, ',' ORDER BY id) FROM idemd_operator_actions`).Scan(&actions); err != nil {
		t.Fatal(err)
	}
	if actions != "alice:reaper_pause:idemctl,bob:reaper_resume:idemctl" {
		t.Fatalf("operator actions %q", actions)
	}
}
