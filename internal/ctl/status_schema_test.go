package ctl_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/idemd/idemd/internal/ctl"
	"github.com/idemd/idemd/internal/migrate"
	"github.com/idemd/idemd/internal/testing/dbtest"
)

// idemctl status shows the database's schema version against idemctl's
// range; on a schema a newer release migrated it says that is safe, and on
// one that lacks a migration idemctl needs it fails naming `idemctl
// migrate`.
func TestStatusSchemaVersions(t *testing.T) {
	url, _ := setup(t)
	ctx := context.Background()
	admin, err := pgx.Connect(ctx, dbtest.AdminURL(t, url))
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
	newest := migrate.Newest()

	code, out, errs := run(t, "--database-url", url, "status")
	if want := fmt.Sprintf("schema: idemd migration %d (this idemctl runs on %d to %d)\n", newest, ctl.OldestSchema, newest); code != 0 || !strings.Contains(out, want) || strings.Contains(out, "note:") {
		t.Fatalf("at the head: exit %d, want %q:\n%s%s", code, want, out, errs)
	}

	if _, err := admin.Exec(ctx, "INSERT INTO "+migrate.VersionTable+" (version_id, is_applied) VALUES ($1, true)", newest+1); err != nil {
		t.Fatal(err)
	}
	code, out, errs = run(t, "--database-url", url, "status")
	if code != 0 || !strings.Contains(out, fmt.Sprintf("schema: idemd migration %d ", newest+1)) ||
		!strings.Contains(out, "note: the database schema (idemd migration") || !strings.Contains(out, "safe") {
		t.Errorf("one migration ahead: exit %d:\n%s%s", code, out, errs)
	}
	code, out, errs = run(t, "--database-url", url, "status", "--format", "json")
	var st ctl.Status
	if err := json.Unmarshal([]byte(out), &st); code != 0 || err != nil {
		t.Fatalf("status --format json: exit %d, %v\n%s%s", code, err, out, errs)
	}
	if s := st.Schema; s.Database != newest+1 || s.BinaryNewest != newest || s.BinaryOldest != ctl.OldestSchema || !s.NewerThanBinary || s.Note == "" {
		t.Errorf("json schema: %+v", s)
	}

	if _, err := admin.Exec(ctx, "DELETE FROM "+migrate.VersionTable+" WHERE version_id = $1", ctl.OldestSchema); err != nil {
		t.Fatal(err)
	}
	code, out, errs = run(t, "--database-url", url, "status")
	if code != 1 || !strings.Contains(errs, "00017_idemd_operator_actions.sql") || !strings.Contains(errs, "run `idemctl migrate`") {
		t.Errorf("migration %d missing: exit %d, want 1 naming it and idemctl migrate:\n%s%s", ctl.OldestSchema, code, out, errs)
	}
}
