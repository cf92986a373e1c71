package migrate_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemd/idemd/internal/migrate"
	"github.com/idemd/idemd/internal/testing/dbtest"
)

// migratedAdminPool is a pool on a database migrated to the head, as the admin, who
// may rewrite goose's version table to stage an older or newer schema.
func migratedAdminPool(t *testing.T) *pgxpool.Pool {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), dbtest.AdminURL(t, dbtest.NewDatabase(t)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// A database a newer release migrated (a version this binary does not ship
// recorded as applied) is newer than the binary and still fine for it,
// with a note that says why; the range is the binary's.
func TestInspectNewerSchema(t *testing.T) {
	pool := migratedAdminPool(t)
	ctx := context.Background()
	newest := migrate.Newest()
	s, err := migrate.Inspect(ctx, pool, newest)
	if err != nil {
		t.Fatal(err)
	}
	if s.Database != newest || s.Newest != newest || s.Oldest != newest || s.NewerThanBinary() || s.Note() != "" || s.Err() != nil {
		t.Fatalf("at the head: %+v, err %v, note %q", s, s.Err(), s.Note())
	}

	future := newest + 1
	if _, err := pool.Exec(ctx, "INSERT INTO "+migrate.VersionTable+" (version_id, is_applied) VALUES ($1, true)", future); err != nil {
		t.Fatal(err)
	}
	s, err = migrate.Inspect(ctx, pool, newest)
	if err != nil {
		t.Fatal(err)
	}
	if !s.NewerThanBinary() || s.Database != future || !slices.Equal(s.Unknown, []int64{future}) || s.Newest != newest {
		t.Fatalf("one migration ahead: %+v", s)
	}
	if err := s.Err(); err != nil {
		t.Fatalf("a newer schema must not stop the binary: %v", err)
	}
	if note := s.Note(); !strings.Contains(note, "newer than this binary") || !strings.Contains(note, "safe") || !strings.Contains(note, "additive") {
		t.Errorf("note %q does not say the newer schema is safe and why", note)
	}
	if err := migrate.Check(ctx, pool); err != nil {
		t.Errorf("Check on a newer schema: %v", err)
	}
}

// A database that lacks a migration is older than a binary that needs it:
// the error names the file and `idemctl migrate`. A binary whose oldest
// schema is below the missing migration runs on it.
func TestInspectMissingMigration(t *testing.T) {
	pool := migratedAdminPool(t)
	ctx := context.Background()
	const missing = 11
	if _, err := pool.Exec(ctx, "DELETE FROM "+migrate.VersionTable+" WHERE version_id = $1", missing); err != nil {
		t.Fatal(err)
	}
	s, err := migrate.Inspect(ctx, pool, migrate.Newest())
	if err != nil {
		t.Fatal(err)
	}
	var pending *migrate.PendingError
	if err := s.Err(); !errors.As(err, &pending) || !slices.Equal(pending.Idemd, []string{"00011_idemd_leases.sql"}) ||
		!strings.Contains(err.Error(), "run `idemctl migrate`") {
		t.Fatalf("migration %d unrecorded: %v (%+v)", missing, err, s)
	}
	if s.NewerThanBinary() {
		t.Errorf("an older schema reported as newer: %+v", s)
	}
	if s, err := migrate.Inspect(ctx, pool, missing); err != nil || s.Err() == nil {
		t.Errorf("oldest schema %d, migration %d missing: %v, want pending", missing, missing, err)
	}
	s, err = migrate.Inspect(ctx, pool, missing-1)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Err(); err != nil {
		t.Errorf("oldest schema %d runs without migration %d: %v", missing-1, missing, err)
	}
}

// Newest is the highest embedded migration, and Known tells shipped
// versions from others.
func TestNewest(t *testing.T) {
	n := migrate.Newest()
	if !migrate.Known(n) || migrate.Known(n+1) || migrate.Known(0) {
		t.Errorf("Newest %d: Known(%d)=%v Known(%d)=%v", n, n, migrate.Known(n), n+1, migrate.Known(n+1))
	}
}
