package daemon

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/idemd/idemd/internal/migrate"
	"github.com/idemd/idemd/internal/testing/dbtest"
)

// The schema check of /readyz against real PostgreSQL: at the head it is
// ready with nothing to say; one migration ahead (a newer release migrated)
// it stays ready, sets the gauge and says why that is safe, logging the
// warning once however often it is asked; one needed migration missing, it
// fails naming `idemctl migrate`.
func TestSchemaWatch(t *testing.T) {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, dbtest.AdminURL(t, dbtest.NewDatabase(t)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	core, logs := observer.New(zap.WarnLevel)
	reg := prometheus.NewRegistry()
	newest := migrate.Newest()
	w := newSchemaWatch(pool, newest, zap.New(core), reg)

	if err := w.check(ctx); err != nil {
		t.Fatalf("at the head: %v", err)
	}
	if got := testutil.ToFloat64(w.newer); got != 0 || w.readyNote() != "" {
		t.Errorf("at the head: newer %v, note %q", got, w.readyNote())
	}
	if got := testutil.ToFloat64(w.database); got != float64(newest) {
		t.Errorf("idemd_schema_version{of=database} %v, want %d", got, newest)
	}

	if _, err := pool.Exec(ctx, "INSERT INTO "+migrate.VersionTable+" (version_id, is_applied) VALUES ($1, true)", newest+1); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if err := w.check(ctx); err != nil {
			t.Fatalf("one migration ahead: %v, want ready", err)
		}
	}
	if got := testutil.ToFloat64(w.newer); got != 1 {
		t.Errorf("idemd_schema_newer_than_binary %v, want 1", got)
	}
	if got := testutil.ToFloat64(w.database); got != float64(newest+1) {
		t.Errorf("idemd_schema_version{of=database} %v, want %d", got, newest+1)
	}
	if note := w.readyNote(); !strings.Contains(note, "newer than this binary") || !strings.Contains(note, "safe") {
		t.Errorf("note %q", note)
	}
	if n := logs.FilterMessageSnippet("newer than this binary").Len(); n != 1 || logs.Len() != 1 {
		t.Errorf("%d warnings about the newer schema (%d log entries) after three checks, want one", n, logs.Len())
	}

	if _, err := pool.Exec(ctx, "DELETE FROM "+migrate.VersionTable+" WHERE version_id = 3"); err != nil {
		t.Fatal(err)
	}
	err = w.check(ctx)
	var pending *migrate.PendingError
	if !errors.As(err, &pending) || !strings.Contains(err.Error(), "00003_staged_jobs.sql") || !strings.Contains(err.Error(), "idemctl migrate") {
		t.Errorf("migration 3 missing: %v, want not ready naming it and idemctl migrate", err)
	}
}
