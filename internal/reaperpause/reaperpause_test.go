package reaperpause

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/idemd/idemd/internal/testing/dbtest"
)

func TestMain(m *testing.M) { dbtest.Main(m) }

// Set, Lock and Clear, as the runtime role: Get and Lock read what Set
// wrote, and nothing after Clear. Who may pause, the refusals and the audit
// record are the operator core's (internal/operator, TestPauseResumeReaper).
func TestSetLockClear(t *testing.T) {
	ctx := context.Background()
	pool := dbtest.NewPool(t)
	if s, err := Get(ctx, pool); err != nil || s != nil {
		t.Fatalf("fresh database: %+v, %v", s, err)
	}
	var want State
	if err := pool.QueryRow(ctx, "SELECT now()").Scan(&want.PausedAt); err != nil {
		t.Fatal(err)
	}
	want.PausedBy, want.Note, want.ActionID = "alice", "replica rebuild", 7
	if err := Set(ctx, pool, want); err != nil {
		t.Fatal(err)
	}
	if s, err := Get(ctx, pool); err != nil || s == nil || s.PausedBy != want.PausedBy || s.Note != want.Note || s.ActionID != want.ActionID || !s.PausedAt.Equal(want.PausedAt) {
		t.Fatalf("after Set: %+v, %v", s, err)
	}
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		s, err := Lock(ctx, tx)
		if err != nil || s == nil || s.PausedBy != "alice" {
			t.Fatalf("Lock: %+v, %v", s, err)
		}
		return Clear(ctx, tx)
	})
	if err != nil {
		t.Fatal(err)
	}
	if s, err := Get(ctx, pool); err != nil || s != nil {
		t.Fatalf("after Clear: %+v, %v", s, err)
	}
}
