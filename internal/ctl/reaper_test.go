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
