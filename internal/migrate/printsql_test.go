package migrate_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"

	"github.com/idemd/idemd/internal/migrate"
)

// applyWithPsql applies script to pool's database as psql -f would (the
// way a team applies it with its own tool), as the pool's role.
func applyWithPsql(t *testing.T, pool *pgxpool.Pool, script string) {
	t.Helper()
	f := filepath.Join(t.TempDir(), "pending.sql")
	if err := os.WriteFile(f, []byte(script), 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("psql", pool.Config().ConnString(), "-X", "-q", "-v", "ON_ERROR_STOP=1", "-f", f).CombinedOutput()
	if err != nil {
		t.Fatalf("psql -f the printed SQL: %v\n%s", err, out)
	}
}

// dumpSchema is the database's schema as pg_dump prints it, without what
// names the database or differs from run to run.
func dumpSchema(t *testing.T, pool *pgxpool.Pool) string {
	t.Helper()
	out, err := exec.Command("pg_dump", "--schema-only", "--no-owner", "--no-privileges", pool.Config().ConnString()).Output()
	if err != nil {
		t.Fatalf("pg_dump: %v", err)
	}
	var keep []string
	for _, l := range strings.Split(string(out), "\n") {
		if l == "" || strings.HasPrefix(l, "--") || strings.HasPrefix(l, "\\restrict") || strings.HasPrefix(l, "\\unrestrict") {
			continue
		}
		keep = append(keep, l)
	}
	return strings.Join(keep, "\n")
}

// The pending migrations as SQL, applied with psql instead of `idemctl
// migrate`, from an empty database and from one a release behind: the
// schema is the one `idemctl migrate` makes, `idemctl migrate` then finds
// nothing to apply, the daemons' schema check passes, and a second print
// is empty.
func TestPrintSQLIsWhatMigrateApplies(t *testing.T) {
	ctx := context.Background()
	reference := emptyDatabase(t)
	if _, err := migrate.Up(ctx, reference, migrate.Options{}); err != nil {
		t.Fatal(err)
	}
	want := dumpSchema(t, reference)
	if !strings.Contains(want, "CREATE TABLE public.staged_jobs") || !strings.Contains(want, "CREATE TABLE public.river_job") {
		t.Fatalf("pg_dump of the migrated database has no staged_jobs or river_job:\n%s", want)
	}

	for _, c := range []struct {
		name string
		from int64 // idemd version migrated first (River too), 0: an empty database
	}{{"empty", 0}, {"behind", 18}} {
		t.Run(c.name, func(t *testing.T) {
			pool := emptyDatabase(t)
			if c.from > 0 {
				rm, err := rivermigrate.New(riverpgxv5.New(pool), nil)
				if err != nil {
					t.Fatal(err)
				}
				if _, err := rm.Migrate(ctx, rivermigrate.DirectionUp, nil); err != nil {
					t.Fatal(err)
				}
				migrateUpTo(t, pool, c.from)
			}
			script, err := migrate.PendingSQL(ctx, pool)
			if err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(script, "00021_staged_jobs_unique.sql") || strings.Contains(script, "00003_staged_jobs.sql") != (c.from == 0) {
				t.Fatalf("the script's migrations are not those pending from %d:\n%s", c.from, headings(script))
			}
			t.Logf("the printed SQL from %d: %d bytes,\n%s", c.from, len(script), headings(script))
			applyWithPsql(t, pool, script)

			res, err := migrate.Up(ctx, pool, migrate.Options{})
			if err != nil || len(res.RiverVersions)+len(res.IdemdVersions) != 0 {
				t.Fatalf("idemctl migrate after the printed SQL ran: %+v, %v; want nothing to apply", res, err)
			}
			if err := migrate.Check(ctx, pool); err != nil {
				t.Fatal(err)
			}
			if got := dumpSchema(t, pool); got != want {
				t.Fatalf("the schema after the printed SQL differs from `idemctl migrate`'s:\n%s", diffLines(want, got))
			}
			if again, err := migrate.PendingSQL(ctx, pool); err != nil || again != "" {
				t.Fatalf("a second print: %q, %v; want nothing", again, err)
			}
		})
	}
}

var headingRE = regexp.MustCompile(`(?m)^-- (River|idemd) migration .*$`)

func headings(script string) string {
	return strings.Join(headingRE.FindAllString(script, -1), "\n")
}

// diffLines lists the lines only one side has.
func diffLines(want, got string) string {
	in := func(s string) map[string]bool {
		m := map[string]bool{}
		for _, l := range strings.Split(s, "\n") {
			m[l] = true
		}
		return m
	}
	w, g := in(want), in(got)
	var b strings.Builder
	for l := range w {
		if !g[l] {
			b.WriteString("- " + l + "\n")
		}
	}
	for l := range g {
		if !w[l] {
			b.WriteString("+ " + l + "\n")
		}
	}
	return b.String()
}
