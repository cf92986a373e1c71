package dbtest_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemd/idemd/internal/testing/dbtest"
)

// TestFreeze: a frozen cluster answers nothing, not even a new connection,
// and closes nothing; thawed, a connection that idled through the freeze
// works again.
func TestFreeze(t *testing.T) {
	c := dbtest.StartCluster(t)
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, c.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	idle, err := pgx.Connect(ctx, c.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer idle.Close(ctx)

	thaw, stopped, err := c.Freeze()
	if err != nil {
		t.Fatal(err)
	}
	thawed := false
	defer func() {
		if !thawed {
			thaw() //nolint:errcheck
		}
	}()
	// The postmaster, the two backends and the server's own processes
	// (checkpointer, writers, launchers).
	if stopped < 4 {
		t.Fatalf("Freeze stopped %d processes, want the postmaster, the backends and the server's own", stopped)
	}
	// Neither the open connection nor a new one gets an answer; the
	// deadlines are the client's, which ends the wait.
	qctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
	var one int
	err = conn.QueryRow(qctx, "SELECT 1").Scan(&one)
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a query on a frozen cluster: %v, want the client's deadline", err)
	}
	cctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
	_, err = pgx.Connect(cctx, c.URL())
	cancel()
	if err == nil {
		t.Fatal("connected to a frozen cluster")
	}

	if err := thaw(); err != nil {
		t.Fatal(err)
	}
	thawed = true
	var one2 int
	if err := idle.QueryRow(ctx, "SELECT 1").Scan(&one2); err != nil {
		t.Fatalf("a connection that idled through the freeze: %v", err)
	}
	conn2, err := pgx.Connect(ctx, c.URL())
	if err != nil {
		t.Fatalf("connect after the thaw: %v", err)
	}
	conn2.Close(ctx)
}
