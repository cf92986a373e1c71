package migrate_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"

	"github.com/idemd/idemd/internal/migrate"
	"github.com/idemd/idemd/migrations"
)

// indexColumnsSQL lists, for every index on idempotency_keys, each column it
// depends on and how, read from the catalog:
//   - key and INCLUDE columns: pg_index.indkey;
//   - columns inside index expressions and partial-index predicates: the
//     column-level dependencies CREATE INDEX records in pg_depend (a
//     whole-row reference is a dependency on column 0 only: every column);
//   - and, as a second net, any column named in the deparsed expressions or
//     predicate (pg_get_expr).
const indexColumnsSQL = `
WITH idx AS (
    SELECT i.indexrelid, i.indrelid, i.indkey, i.indexprs, i.indpred
    FROM pg_index i
    WHERE i.indrelid = 'idempotency_keys'::regclass
), cols AS (
    SELECT a.attnum, a.attname
    FROM pg_attribute a
    WHERE a.attrelid = 'idempotency_keys'::regclass AND a.attnum > 0 AND NOT a.attisdropped
)
SELECT x.indexrelid::regclass::text, c.attname, 'key or INCLUDE column'
FROM idx x CROSS JOIN LATERAL unnest(x.indkey::int2[]) AS k(attnum)
JOIN cols c ON c.attnum = k.attnum
UNION
SELECT x.indexrelid::regclass::text, c.attname, 'expression or predicate (pg_depend)'
FROM idx x
JOIN pg_depend d ON d.classid = 'pg_class'::regclass AND d.objid = x.indexrelid
                AND d.refclassid = 'pg_class'::regclass AND d.refobjid = x.indrelid
JOIN cols c ON c.attnum = d.refobjsubid
             -- Column 0 alone: the index's expressions use the whole row
             -- (CREATE INDEX also adds it when they name no column at all).
             OR (d.refobjsubid = 0 AND NOT EXISTS (
                     SELECT 1 FROM pg_depend d2
                     WHERE d2.classid = d.classid AND d2.objid = d.objid
                       AND d2.refclassid = d.refclassid AND d2.refobjid = d.refobjid AND d2.refobjsubid > 0))
UNION
SELECT x.indexrelid::regclass::text, c.attname, 'expression or predicate (text)'
FROM idx x JOIN cols c
  ON (COALESCE(pg_get_expr(x.indexprs, x.indrelid), '') || ' ' || COALESCE(pg_get_expr(x.indpred, x.indrelid), ''))
     ~ ('\m' || c.attname || '\M')
ORDER BY 1, 2, 3`

// apiColumnIndexes returns one line per (index, API-updated column, how).
func apiColumnIndexes(t *testing.T, pool *pgxpool.Pool) []string {
	t.Helper()
	rows, err := pool.Query(context.Background(), indexColumnsSQL)
	if err != nil {
		t.Fatal(err)
	}
	type dep struct{ index, column, how string }
	deps, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (dep, error) {
		var d dep
		return d, r.Scan(&d.index, &d.column, &d.how)
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(deps) == 0 {
		t.Fatal("no index of idempotency_keys found in the catalog: the query is broken")
	}
	api := migrations.APIUpdatedColumnList()
	var bad []string
	for _, d := range deps {
		if slices.Contains(api, d.column) {
			bad = append(bad, fmt.Sprintf("%s depends on %s (%s)", d.index, d.column, d.how))
		}
	}
	return bad
}

// No index on idempotency_keys may depend on a column the API updates per
// phase (migrations.APIUpdatedColumns): any such index turns the API's
// updates from HOT updates into index writes.
func TestNoIndexOnAPIUpdatedColumns(t *testing.T) {
	t.Run("fresh", func(t *testing.T) {
		pool := emptyDatabase(t)
		if _, err := migrate.Up(context.Background(), pool, migrate.Options{}); err != nil {
			t.Fatal(err)
		}
		if bad := apiColumnIndexes(t, pool); len(bad) > 0 {
			t.Fatalf("indexes on API-updated columns:\n%s", strings.Join(bad, "\n"))
		}
	})
	t.Run("article schema", func(t *testing.T) {
		pool := emptyDatabase(t)
		ctx := context.Background()
		if _, err := pool.Exec(ctx, articleSchema); err != nil {
			t.Fatal(err)
		}
		if _, err := migrate.Up(ctx, pool, migrate.Options{}); err != nil {
			t.Fatal(err)
		}
		if bad := apiColumnIndexes(t, pool); len(bad) > 0 {
			t.Fatalf("indexes on API-updated columns:\n%s", strings.Join(bad, "\n"))
		}
	})
	// The check itself: each way an index can depend on a column is seen.
	t.Run("detects", func(t *testing.T) {
		pool := emptyDatabase(t)
		ctx := context.Background()
		if _, err := migrate.Up(ctx, pool, migrate.Options{}); err != nil {
			t.Fatal(err)
		}
		for _, c := range []struct{ ddl, want string }{
			{`CREATE INDEX old_unfinished ON idempotency_keys (created_at) WHERE recovery_point <> 'finished' AND completer_gave_up_at IS NULL`,
				"old_unfinished depends on recovery_point (expression or predicate (pg_depend))"},
			{`CREATE INDEX by_lock ON idempotency_keys (user_id, locked_at)`, "by_lock depends on locked_at (key or INCLUDE column)"},
			{`CREATE INDEX incl ON idempotency_keys (created_at) INCLUDE (response_code)`, "incl depends on response_code (key or INCLUDE column)"},
			{`CREATE INDEX expr ON idempotency_keys ((last_run_at IS NULL))`, "expr depends on last_run_at (expression or predicate (pg_depend))"},
			{`CREATE INDEX expr_text ON idempotency_keys ((lower(response_body)))`, "expr_text depends on response_body (expression or predicate (text))"},
			{`CREATE INDEX pred_only ON idempotency_keys (user_id) WHERE locked_at IS NOT NULL`, "pred_only depends on locked_at (expression or predicate (text))"},
			{`CREATE INDEX whole_row ON idempotency_keys ((idempotency_keys IS NOT NULL))`, "whole_row depends on upstream_idempotency_key (expression or predicate (pg_depend))"},
		} {
			if _, err := pool.Exec(ctx, c.ddl); err != nil {
				t.Fatal(err)
			}
			if bad := apiColumnIndexes(t, pool); !slices.Contains(bad, c.want) {
				t.Errorf("%s: not reported; got\n%s", c.ddl, strings.Join(bad, "\n"))
			}
		}
	})
}

// articleSchema is the article's schema with one user to own keys.
const articleSchema = migrations.ArticleSchema + `INSERT INTO users (email) VALUES ('a@example.com');`

// An installation at 00011 moves to the side table while its API keeps
// inserting keys: every key unfinished at the end is tracked, the given-up
// and finished ones from before are not, and the old index is gone. With
// the completer's partial index (an upgrade) the backfill reads it; without
// it (an API adopting idemd on its own table) it scans the table, whose
// ids here are spread far apart.
func TestUpgradeToUnfinishedKeysTableUnderTraffic(t *testing.T) {
	for _, partial := range []bool{true, false} {
		t.Run(fmt.Sprintf("partial index %v", partial), func(t *testing.T) { upgradeToUnfinishedKeysTable(t, partial) })
	}
}

func upgradeToUnfinishedKeysTable(t *testing.T, partial bool) {
	pool := emptyDatabase(t)
	ctx := context.Background()
	if _, err := pool.Exec(ctx, articleSchema); err != nil {
		t.Fatal(err)
	}
	migrateUpTo(t, pool, 11)
	if partial {
		// The completer's partial index as 00002 creates it, which 00012
		// must drop.
		if _, err := pool.Exec(ctx, `CREATE INDEX IF NOT EXISTS idempotency_keys_unfinished ON idempotency_keys (created_at)
WHERE recovery_point <> 'finished' AND completer_gave_up_at IS NULL`); err != nil {
			t.Fatal(err)
		}
	}
	// 300 keys, with ids from 1 to 150 and from 50,000 up to 2,549,999.
	if _, err := pool.Exec(ctx, `
INSERT INTO idempotency_keys (id, idempotency_key, request_method, request_params, request_path, recovery_point, user_id, completer_gave_up_at)
SELECT CASE WHEN g <= 150 THEN g ELSE (g - 150) / 3 * 50000 + (g % 3) - 1 + 50000 END,
       'old-' || g, 'POST', '{}', '/rides',
       CASE WHEN g % 3 = 0 THEN 'finished' ELSE 'started' END, 1,
       CASE WHEN g % 5 = 0 THEN now() END
FROM generate_series(1, 300) g;
SELECT setval(pg_get_serial_sequence('idempotency_keys', 'id'), (SELECT max(id) FROM idempotency_keys))`); err != nil {
		t.Fatal(err)
	}

	// The API inserts keys (half of them finished at once, as if replayed
	// from another system) and finishes some, until the migration is done.
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var apiErr error
	wg.Add(1)
	go func() {
		defer wg.Done()
		for n := 0; ; n++ {
			select {
			case <-stop:
				return
			default:
			}
			rp := "started"
			if n%2 == 1 {
				rp = "finished"
			}
			var id int64
			if err := pool.QueryRow(ctx, `
INSERT INTO idempotency_keys (idempotency_key, request_method, request_params, request_path, recovery_point, user_id)
VALUES ($1, 'POST', '{}', '/rides', $2, 1) RETURNING id`, fmt.Sprintf("live-%d", n), rp).Scan(&id); err != nil {
				apiErr = err
				return
			}
			if n%4 == 0 {
				if _, err := pool.Exec(ctx, `UPDATE idempotency_keys SET recovery_point = 'ride_created' WHERE id = $1`, id); err != nil {
					apiErr = err
					return
				}
			}
		}
	}()
	_, err := migrate.Up(ctx, pool, migrate.Options{})
	close(stop)
	wg.Wait()
	if err != nil {
		t.Fatal(err)
	}
	if apiErr != nil {
		t.Fatal(apiErr)
	}
	var missing, extra, live int
	var stillOld bool
	if err := pool.QueryRow(ctx, `
SELECT (SELECT count(*) FROM idempotency_keys k
        WHERE k.recovery_point <> 'finished' AND k.completer_gave_up_at IS NULL
          AND NOT EXISTS (SELECT 1 FROM idemd_unfinished_keys u WHERE u.key_id = k.id AND u.created_at = k.created_at)),
       (SELECT count(*) FROM idemd_unfinished_keys u JOIN idempotency_keys k ON k.id = u.key_id
        WHERE k.idempotency_key LIKE 'old-%' AND (k.recovery_point = 'finished' OR k.completer_gave_up_at IS NOT NULL)),
       (SELECT count(*) FROM idempotency_keys WHERE idempotency_key LIKE 'live-%'),
       to_regclass('idempotency_keys_unfinished') IS NOT NULL`).Scan(&missing, &extra, &live, &stillOld); err != nil {
		t.Fatal(err)
	}
	if missing != 0 || extra != 0 || stillOld {
		t.Fatalf("untracked unfinished keys %d, tracked finished or given-up old keys %d, old index still there %v", missing, extra, stillOld)
	}
	t.Logf("%d keys inserted during the migration", live)
}

func keysFillfactor(t *testing.T, pool *pgxpool.Pool) string {
	t.Helper()
	var ff string
	if err := pool.QueryRow(context.Background(), `
SELECT COALESCE((SELECT o FROM pg_class c, unnest(c.reloptions) o WHERE c.oid = 'idempotency_keys'::regclass AND o LIKE 'fillfactor=%'), '')`).Scan(&ff); err != nil {
		t.Fatal(err)
	}
	return ff
}

// idempotency_keys gets fillfactor 90 (free space on each new page for the
// API's HOT updates), unless the operator already chose one.
func TestKeysFillfactor(t *testing.T) {
	pool := emptyDatabase(t)
	ctx := context.Background()
	if _, err := migrate.Up(ctx, pool, migrate.Options{}); err != nil {
		t.Fatal(err)
	}
	if ff := keysFillfactor(t, pool); ff != "fillfactor=90" {
		t.Fatalf("fresh installation: %q", ff)
	}

	pool = emptyDatabase(t)
	if _, err := pool.Exec(ctx, articleSchema+`ALTER TABLE idempotency_keys SET (fillfactor = 70);`); err != nil {
		t.Fatal(err)
	}
	if _, err := migrate.Up(ctx, pool, migrate.Options{}); err != nil {
		t.Fatal(err)
	}
	if ff := keysFillfactor(t, pool); ff != "fillfactor=70" {
		t.Fatalf("the operator's fillfactor was changed: %q", ff)
	}
}

// migrateUpTo applies idemd's migrations up to version on pool's database,
// as an older release's `idemctl migrate` left it.
func migrateUpTo(t *testing.T, pool *pgxpool.Pool, version int64) {
	t.Helper()
	db := stdlib.OpenDBFromPool(pool)
	defer db.Close()
	provider, err := goose.NewProvider(goose.DialectPostgres, db, migrate.Files(),
		goose.WithTableName(migrate.VersionTable), goose.WithDisableGlobalRegistry(true))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := provider.UpTo(context.Background(), version); err != nil {
		t.Fatal(err)
	}
}
