package operator

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/idemd/idemd/internal/reaperpause"
	"github.com/idemd/idemd/internal/testing/dbtest"
)

// isRefusal: err maps to idemctl's exit 3 (daemon.Refusal, which this
// package cannot import).
func isRefusal(err error) bool {
	var r interface{ Refusal() }
	return errors.As(err, &r)
}

// A pause and its resume of the reaper, as the runtime role: each refuses the wrong
// state, names who paused, and records itself in idemd_operator_actions
// (the resume with the pause it lifted).
func TestPauseResumeReaper(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := dbtest.NewPool(t)

	if s, err := reaperpause.Get(ctx, pool); err != nil || s != nil {
		t.Fatalf("fresh database: %+v, %v", s, err)
	}
	if _, err := ResumeReaper(ctx, pool, Actor{By: "alice", Via: ViaIdemctl}, "nothing to resume"); !errors.Is(err, ErrRefused) || !isRefusal(err) {
		t.Fatalf("resume while not paused: %v, want refused (exit 3)", err)
	}
	if _, err := PauseReaper(ctx, pool, Actor{By: " ", Via: ViaIdemctl}, ""); !errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), "identity") || !strings.Contains(err.Error(), "note") {
		t.Fatalf("pause without who and why: %v", err)
	}
	p, err := PauseReaper(ctx, pool, Actor{By: "alice", Via: ViaIdemctl}, "replica rebuild in progress")
	if err != nil {
		t.Fatal(err)
	}
	s, err := reaperpause.Get(ctx, pool)
	if err != nil || s == nil || s.PausedBy != "alice" || s.ActionID != p.ID || !s.PausedAt.Equal(p.At) {
		t.Fatalf("paused: %+v, %v (action %+v)", s, err, p)
	}
	if _, err := PauseReaper(ctx, pool, Actor{By: "bob", Via: ViaIdemctl}, "again"); !errors.Is(err, ErrRefused) || !isRefusal(err) || !strings.Contains(err.Error(), "alice") {
		t.Fatalf("second pause: %v, want refused naming alice", err)
	}
	r, err := ResumeReaper(ctx, pool, Actor{By: "bob", Via: ViaIdemctl}, "rebuild done")
	if err != nil {
		t.Fatal(err)
	}
	if r.Was == nil || r.Was.PausedBy != "alice" {
		t.Fatalf("resume: %+v, want the pause it lifted", r)
	}
	if s, err := reaperpause.Get(ctx, pool); err != nil || s != nil {
		t.Fatalf("resumed: %+v, %v", s, err)
	}
	rows, err := pool.Query(ctx, `SELECT actor, action, via, note, detail->>'paused_by' FROM idemd_operator_actions ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for rows.Next() {
		var actor, action, via, note string
		var pausedBy *string
		if err := rows.Scan(&actor, &action, &via, &note, &pausedBy); err != nil {
			t.Fatal(err)
		}
		pb := "-"
		if pausedBy != nil {
			pb = *pausedBy
		}
		got = append(got, strings.Join([]string{actor, action, via, note, pb}, "|"))
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	want := []string{"alice|reaper_pause|idemctl|replica rebuild in progress|-", "bob|reaper_resume|idemctl|rebuild done|alice"}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("audit:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}
