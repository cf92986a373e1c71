package reaperpause

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/idemd/idemd/internal/testing/dbtest"
)

func TestMain(m *testing.M) { dbtest.Main(m) }

// A pause and its resume, as the runtime role: each refuses the wrong
// state, names who paused, and records itself in idemd_operator_actions
// (the resume with the pause it lifted).
func TestPauseResume(t *testing.T) {
	ctx := context.Background()
	pool := dbtest.NewPool(t)

	if s, err := Get(ctx, pool); err != nil || s != nil {
		t.Fatalf("fresh database: %+v, %v", s, err)
	}
	if _, err := Resume(ctx, pool, "alice", "idemctl", "nothing to resume"); !errors.Is(err, ErrRefused) {
		t.Fatalf("resume while not paused: %v, want refused", err)
	}
	if _, err := Pause(ctx, pool, " ", "idemctl", ""); !errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), "identity") || !strings.Contains(err.Error(), "note") {
		t.Fatalf("pause without who and why: %v", err)
	}
	p, err := Pause(ctx, pool, "alice", "idemctl", "replica rebuild in progress")
	if err != nil {
		t.Fatal(err)
	}
	s, err := Get(ctx, pool)
	if err != nil || s == nil || s.PausedBy != "alice" || s.ActionID != p.ID || !s.PausedAt.Equal(p.At) {
		t.Fatalf("paused: %+v, %v (action %+v)", s, err, p)
	}
	if _, err := Pause(ctx, pool, "bob", "idemctl", "again"); !errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), "alice") {
		t.Fatalf("second pause: %v, want refused naming alice", err)
	}
	r, err := Resume(ctx, pool, "bob", "idemctl", "rebuild done")
	if err != nil {
		t.Fatal(err)
	}
	if r.Was == nil || r.Was.PausedBy != "alice" {
		t.Fatalf("resume: %+v, want the pause it lifted", r)
	}
	if s, err := Get(ctx, pool); err != nil || s != nil {
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
