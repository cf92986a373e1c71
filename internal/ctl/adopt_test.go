package ctl_test

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemd/idemd/internal/migrate"
	"github.com/idemd/idemd/internal/testing/articletest"
	"github.com/idemd/idemd/internal/testing/dbtest"
)

// `idemctl migrate` on a database with the article's JSONB response_body
// says so and leaves it; only --adopt-article-schema changes it.
func TestMigrateAdoptArticleSchema(t *testing.T) {
	u := dbtest.MigratorURL(articletest.NewDatabase(t))
	pool, err := pgxpool.New(context.Background(), u)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	typ := func() string {
		t.Helper()
		typ, err := migrate.ResponseBodyType(context.Background(), pool)
		if err != nil {
			t.Fatal(err)
		}
		return typ
	}
	db := []string{"--database-url", u, "--log-level", "warn"}

	code, out, errs := run(t, append(db, "migrate")...)
	if code != 0 {
		t.Fatalf("migrate: exit %d\n%s%s", code, out, errs)
	}
	// The hint says that the API may stay as it is, and what the adoption
	// requires of its code first (internal/migrate's
	// TestAdoptArticleAPIWrites shows both on PostgreSQL).
	for _, want := range []string{
		"response_body is jsonb",
		"keeps working on this database as it is",
		"--adopt-article-schema",
		"Change the API first",
		"JSON-encoded string",
		"PG::UndefinedColumn",
		"docs/operations.md",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("migrate's hint lacks %q:\n%s", want, out)
		}
	}
	if typ() != "jsonb" {
		t.Fatal("plain migrate changed response_body")
	}

	code, out, errs = run(t, append(db, "migrate", "--adopt-article-schema", "--adopt-batch-size", "0")...)
	if code != 2 || !strings.Contains(errs, "--adopt-batch-size") {
		t.Fatalf("bad batch size: exit %d\n%s%s", code, out, errs)
	}

	code, out, errs = run(t, append(db, "migrate", "--adopt-article-schema", "--adopt-batch-size", "10")...)
	if code != 0 || !strings.Contains(out, "moved from jsonb to TEXT") {
		t.Fatalf("adopt: exit %d\n%s%s", code, out, errs)
	}
	if typ() != "text" {
		t.Fatal("response_body is not TEXT after adoption")
	}

	code, out, errs = run(t, append(db, "migrate", "--adopt-article-schema")...)
	if code != 0 || !strings.Contains(out, "already TEXT") {
		t.Fatalf("adopt again: exit %d\n%s%s", code, out, errs)
	}
	code, out, errs = run(t, append(db, "migrate")...)
	if code != 0 || strings.Contains(out, "response_body is") {
		t.Fatalf("migrate after adoption: exit %d\n%s%s", code, out, errs)
	}
}
