package load

import (
	"context"
	"testing"
	"time"

	"github.com/idemd/idemd/internal/testing/dbtest"
)

// TestMigrationStepWindows: a step's window ends in the middle of the
// millisecond of its log line's time and starts its logged duration
// before, or where the step before it ended.
func TestMigrationStepWindows(t *testing.T) {
	out := `{"level":"info","ts":"2026-12-04T15:51:46.120Z","msg":"river migrate: Applied migration","version":6,"duration":"4ms"}
not json
{"level":"info","ts":"2026-12-04T15:51:46.300Z","msg":"migration completed","source":"00018_staged_jobs_wake.sql","duration_seconds":0.25}
{"level":"info","ts":"2026-12-04T15:51:46.400Z","msg":"successfully migrated database"}`
	steps := migrationSteps(out)
	if len(steps) != 2 {
		t.Fatalf("%d steps: %+v", len(steps), steps)
	}
	ts := func(s string) time.Time {
		v, err := time.Parse(time.RFC3339Nano, s)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	for i, want := range []struct {
		name       string
		d          time.Duration
		start, end time.Time
	}{
		{"River 006", 4 * time.Millisecond, ts("2026-12-04T15:51:46.1165Z"), ts("2026-12-04T15:51:46.1205Z")},
		{"idemd 00018_staged_jobs_wake", 250 * time.Millisecond, ts("2026-12-04T15:51:46.1205Z"), ts("2026-12-04T15:51:46.3005Z")},
	} {
		s := steps[i]
		if s.Name != want.name || s.Duration != want.d || !s.Start.Equal(want.start) || !s.End.Equal(want.end) {
			t.Errorf("step %d: %s %s [%s, %s], want %s %s [%s, %s]", i, s.Name, s.Duration, s.Start, s.End, want.name, want.d, want.start, want.end)
		}
	}
}

// TestStepLocks: the sampler's samples are attributed to the step whose
// window holds them; a run of samples is bounded by the samples around it
// and by the window; relations no sample in the step could name are
// counted as created by it, weak locks on indexes left out; the API's
// longest wait is found per session.
func TestStepLocks(t *testing.T) {
	t0 := time.Date(2026, 12, 4, 12, 0, 0, 0, time.UTC)
	ms := func(n int) time.Time { return t0.Add(time.Duration(n) * time.Millisecond) }
	staged := sampledLock{locktype: "relation", relation: 20000, relname: "staged_jobs", relkind: "r", mode: "ShareRowExclusiveLock", granted: true}
	keys := sampledLock{locktype: "relation", relation: 20001, relname: "idempotency_keys", relkind: "r", mode: "AccessShareLock", granted: true}
	keysIndex := sampledLock{locktype: "relation", relation: 20003, relname: "idempotency_keys_pkey", relkind: "i", mode: "AccessShareLock", granted: true}
	ginIndex := sampledLock{locktype: "relation", relation: 20004, relname: "river_job_args_index", relkind: "i", mode: "AccessExclusiveLock", granted: true}
	created := sampledLock{locktype: "relation", relation: 20002, mode: "AccessExclusiveLock", granted: true}
	wait := func(pid int) sampledLock {
		return sampledLock{api: true, pid: pid, locktype: "relation", relation: 20000, relname: "staged_jobs", mode: "RowExclusiveLock", behind: pid == 7}
	}
	s := &lockSampler{interval: 5 * time.Millisecond, samples: []lockSample{
		{at: ms(0)},
		{at: ms(5), locks: []sampledLock{staged, keys, keysIndex, wait(7)}},
		{at: ms(10), locks: []sampledLock{staged, staged, wait(7), wait(8)}}, // two migrator sessions
		{at: ms(15), locks: []sampledLock{created}},
		{at: ms(20), locks: []sampledLock{keys}},
		{at: ms(30), locks: []sampledLock{keys, ginIndex, {api: true, pid: 9, locktype: "transactionid", mode: "ShareLock"}}},
		{at: ms(35)},
	}}
	names := s.names()
	names[20002] = "idemd_new_table"

	st := s.stepLocks(ms(3), ms(16), names)
	if st.Samples != 3 || st.NewHeld != 1 || len(st.Held) != 2 {
		t.Fatalf("%+v", st)
	}
	// staged_jobs seen at 5 and 10: between the samples at 0 and 15.
	if h := st.Held[0]; h.Relation != "staged_jobs" || h.Mode != "ShareRowExclusiveLock" || h.Samples != 2 || h.AtMost != 13*time.Millisecond {
		t.Errorf("the strongest lock: %+v (capped at the window's 13 ms)", h)
	}
	if h := st.Held[1]; h.Relation != "idempotency_keys" || h.Samples != 1 || h.AtMost != 10*time.Millisecond {
		t.Errorf("the weaker lock: %+v", h)
	}
	if !st.APIWaited || st.APIWaits.Sessions != 2 || st.APIWaits.BehindMigrator != 1 || st.APIWaits.AtMost != 13*time.Millisecond ||
		st.APIWaits.What != "RowExclusiveLock on staged_jobs, behind migrate" {
		t.Errorf("API waits: %+v", st.APIWaits)
	}

	late := s.stepLocks(ms(18), ms(40), names)
	if late.Samples != 3 || len(late.Held) != 2 || late.Held[0].Relation != "river_job_args_index" || late.Held[1].AtMost != 20*time.Millisecond ||
		late.APIWaits.What != "ShareLock on the transactionid" {
		t.Errorf("a later step: %+v", late)
	}
	if none := s.stepLocks(ms(1), ms(4), names); none.Samples != 0 || none.APIWaited || len(none.Held) != 0 {
		t.Errorf("a step between samples: %+v", none)
	}
	out := s.outsideLocks(ms(0), ms(35), [][2]time.Time{{ms(3), ms(16)}, {ms(18), ms(40)}}, names)
	if out.Samples != 1 || len(out.Held) != 0 {
		t.Errorf("outside the steps: %+v", out)
	}
	if g := s.longestGap(ms(0), ms(35)); g != 10*time.Millisecond {
		t.Errorf("longest gap %s", g)
	}
}

// TestOverlapping: a step's API figures are the requests overlapping its
// window and the longest commit gap overlapping it, even one that spans
// the whole window.
func TestOverlapping(t *testing.T) {
	t0 := time.Date(2026, 12, 4, 12, 0, 0, 0, time.UTC)
	ms := func(n int) time.Time { return t0.Add(time.Duration(n) * time.Millisecond) }
	l := &apiLoad{
		requests: []apiRequest{
			{scheduled: ms(0), done: ms(9)},   // ends before
			{scheduled: ms(5), done: ms(40)},  // spans it
			{scheduled: ms(22), done: ms(25)}, // inside
			{scheduled: ms(30), done: ms(31)}, // starts after
		},
		commits: []time.Time{ms(9), ms(2), ms(40), ms(25), ms(31)},
	}
	w := l.overlapping(ms(10), ms(24))
	if w.Requests != 2 || w.Max != 35*time.Millisecond || w.P50 != 3*time.Millisecond {
		t.Errorf("requests %+v", w)
	}
	if w.LongestStall != 16*time.Millisecond { // 9 -> 25
		t.Errorf("stall %s", w.LongestStall)
	}
}

// TestMigrationsSmoke runs the benchmark at a toy size on the test server:
// the seed (River and staged jobs included) loads, the API's requests,
// staging included, succeed before and during the migration, and every
// migration has a window. Skipped with -short (it builds the binaries).
func TestMigrationsSmoke(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binaries and runs processes")
	}
	for _, article := range []bool{false, true} {
		rep, err := Migrations(context.Background(), dbtest.ServerURL(t), MigrationsOptions{
			Keys: 2000, Jobs: 1000, Article: article, Before: 2 * time.Second, SharedServer: true, Logf: t.Logf,
		})
		if err != nil {
			t.Fatal(err)
		}
		if rep.Before.Requests == 0 || rep.Before.Errors != 0 || rep.During.Requests == 0 || rep.During.Errors != 0 {
			t.Errorf("article %v: API before %+v, during %+v", article, rep.Before, rep.During)
		}
		if len(rep.Steps) == 0 || rep.StagedJobs != 1000 || rep.RiverJobs != map[bool]int{false: 1000, true: 0}[article] {
			t.Errorf("article %v: %d steps, %d staged, %d River jobs", article, len(rep.Steps), rep.StagedJobs, rep.RiverJobs)
		}
		for _, s := range rep.Steps {
			if s.End.Before(s.Start) || s.Start.Before(rep.migStart.Add(-time.Millisecond)) || s.End.After(rep.migEnd.Add(time.Millisecond)) {
				t.Errorf("article %v: %s's window [%s, %s] outside the migration's [%s, %s]", article, s.Name, s.Start, s.End, rep.migStart, rep.migEnd)
			}
		}
	}
}
