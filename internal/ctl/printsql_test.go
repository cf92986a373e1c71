package ctl_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemd/idemd/internal/migrate"
	"github.com/idemd/idemd/internal/testing/dbtest"
)

// TestMigratePrintSQL: what `idemctl migrate --print-sql` prints for a
// database without the schema, applied by another tool (psql here), leaves
// the schema `idemctl migrate` makes, recorded so that idemd knows: the
// readiness check finds nothing pending, `idemctl migrate` applies nothing
// and a second print is empty.
func TestMigratePrintSQL(t *testing.T) {
	psql, err := exec.LookPath("psql")
	if err != nil {
		t.Fatal("psql is needed: the printed SQL is applied as a team's own tool would")
	}
	pgDump, err := exec.LookPath("pg_dump")
	if err != nil {
		t.Fatal("pg_dump is needed to compare the two schemas")
	}
	printed := dbtest.MigratorURL(dbtest.NewEmptyDatabase(t))
	if code, out, errs := run(t, "--database-url", printed, "migrate", "--print-sql", "--adopt-article-schema"); code != 2 || out != "" {
		t.Errorf("--print-sql with --adopt-article-schema: exit %d, want 2\n%s%s", code, out, errs)
	}
	migrated := dbtest.MigratorURL(dbtest.NewEmptyDatabase(t))

	code, sql, errs := run(t, "--database-url", printed, "migrate", "--print-sql")
	if code != 0 || !strings.Contains(sql, "INSERT INTO river_migration") || !strings.Contains(sql, "INSERT INTO "+migrate.VersionTable) {
		t.Fatalf("print: exit %d\n%s\n%s", code, errs, sql)
	}
	file := filepath.Join(t.TempDir(), "pending.sql")
	if err := os.WriteFile(file, []byte(sql), 0o600); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(psql, "-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", printed, "-f", file).CombinedOutput(); err != nil {
		t.Fatalf("psql -f: %v\n%s", err, out)
	}
	if code, out, errs := run(t, "--database-url", migrated, "--log-level", "warn", "migrate"); code != 0 {
		t.Fatalf("migrate: exit %d\n%s%s", code, out, errs)
	}

	// The same schema, object for object, privileges included.
	dump := func(url string) string {
		out, err := exec.Command(pgDump, "--schema-only", "-d", url).Output()
		if err != nil {
			t.Fatalf("pg_dump: %v", err)
		}
		// pg_dump's \restrict lines carry a random key of each dump.
		return regexp.MustCompile(`(?m)^\\(un)?restrict .*$`).ReplaceAllString(string(out), "")
	}
	if a, b := dump(printed), dump(migrated); a != b {
		t.Errorf("the schema applied from the printed SQL differs from idemctl migrate's:\n%s", firstDiff(a, b))
	}
	// The same versions recorded, in River's table and in idemd's.
	versions := func(url string) string {
		conn, err := pgx.Connect(context.Background(), url)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close(context.Background())
		var river, idemd string
		if err := conn.QueryRow(context.Background(), `SELECT
(SELECT coalesce(string_agg(line || ':' || version, ',' ORDER BY line, version), '') FROM river_migration),
(SELECT coalesce(string_agg(version_id || ':' || is_applied, ',' ORDER BY id), '') FROM `+migrate.VersionTable+`)`).Scan(&river, &idemd); err != nil {
			t.Fatal(err)
		}
		return river + " | " + idemd
	}
	if a, b := versions(printed), versions(migrated); a != b {
		t.Errorf("recorded versions differ:\nprinted  %s\nmigrated %s", a, b)
	}

	// idemd sees nothing pending: the daemons' readiness check, migrate,
	// and a second print.
	pool, err := pgxpool.New(context.Background(), printed)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if err := migrate.Check(context.Background(), pool); err != nil {
		t.Errorf("after the printed SQL: %v", err)
	}
	if code, out, errs := run(t, "--database-url", printed, "migrate", "--print-sql"); code != 0 || out != "" || !strings.Contains(errs, "nothing pending") {
		t.Errorf("second print: exit %d, stdout %q\n%s", code, out, errs)
	}
	if code, out, errs := run(t, "--database-url", printed, "--log-level", "warn", "migrate"); code != 0 || !strings.Contains(out, "applied 0 River and 0 idemd migrations") {
		t.Errorf("migrate after the printed SQL: exit %d\n%s%s", code, out, errs)
	}
	if code, out, errs := run(t, "--database-url", dbtest.RuntimeURL(printed), "status"); code != 0 {
		t.Errorf("status (the daemons' schema check) after the printed SQL: exit %d\n%s%s", code, out, errs)
	}
}

// firstDiff shows where two texts first differ, with some context.
func firstDiff(a, b string) string {
	al, bl := strings.Split(a, "\n"), strings.Split(b, "\n")
	for i := 0; i < len(al) && i < len(bl); i++ {
		if al[i] != bl[i] {
			from := max(0, i-3)
			return fmt.Sprintf("line %d\nprinted:\n%s\nmigrated:\n%s", i+1,
				strings.Join(al[from:min(len(al), i+3)], "\n"), strings.Join(bl[from:min(len(bl), i+3)], "\n"))
		}
	}
	return fmt.Sprintf("one is a prefix of the other (%d and %d lines)", len(al), len(bl))
}
