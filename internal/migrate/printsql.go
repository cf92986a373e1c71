package migrate

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io/fs"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pressly/goose/v3/database"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"

	rolesql "github.com/idemd/idemd/deploy/sql"
	"github.com/idemd/idemd/internal/riverdb"
)

// PendingSQL is `idemctl migrate --print-sql`: the migrations the database
// lacks, River's and then idemd's, as one SQL script a team applies with
// its own tool (Flyway, Atlas, goose, Rails, psql -f) instead of `idemctl
// migrate`. It changes nothing. Each migration is followed by the row
// River's migrator or goose would record for it (river_migration,
// idemd_schema_migrations, created as goose creates it where missing), in
// the same transaction where the migration runs in one, so idemd learns
// what ran exactly as if it had run it: `idemctl migrate` then finds
// nothing to apply and the daemons' /readyz passes. The grants `idemctl
// migrate` applies after a run (deploy/sql/grants.sql) end the script.
// Nothing pending: "".
//
// The script is for the database it was printed from: it is what that
// database lacks. River's migrations are printed only where `idemctl
// migrate` would run them (not where River's tables belong to the API's
// role), with River's own SQL for each version (its migrator's dry run).
func PendingSQL(ctx context.Context, pool *pgxpool.Pool) (string, error) {
	var b strings.Builder
	river, err := readRiverTables(ctx, pool)
	if err != nil {
		return "", err
	}
	action, err := decideRiver(river)
	if err != nil {
		return "", err
	}
	pending := 0
	if action == riverMigrate {
		migrator, err := rivermigrate.New(riverpgxv5.New(pool), nil)
		if err != nil {
			return "", fmt.Errorf("migrate: print sql: river migrator: %w", err)
		}
		res, err := migrator.Migrate(ctx, rivermigrate.DirectionUp, &rivermigrate.MigrateOpts{DryRun: true})
		if err != nil {
			return "", fmt.Errorf("migrate: print sql: river: %w", err)
		}
		for _, v := range res.Versions {
			pending++
			fmt.Fprintf(&b, "-- River migration %03d (%s)\nBEGIN;\n%s\n%s;\nCOMMIT;\n\n", v.Version, v.Name, strings.TrimSpace(v.SQL), riverdb.MigrationInsert(v.Version))
		}
	}

	idemd, tableExists, err := pendingIdemd(ctx, pool)
	if err != nil {
		return "", err
	}
	if len(idemd) > 0 {
		rec := &recorder{}
		store, err := database.NewStore(database.DialectPostgres, VersionTable)
		if err != nil {
			return "", fmt.Errorf("migrate: print sql: goose store: %w", err)
		}
		if !tableExists {
			// What goose does on its first run: the table, and version 0.
			if err := store.CreateVersionTable(ctx, rec); err != nil {
				return "", fmt.Errorf("migrate: print sql: %w", err)
			}
			if err := store.Insert(ctx, rec, database.InsertRequest{Version: 0}); err != nil {
				return "", fmt.Errorf("migrate: print sql: %w", err)
			}
			fmt.Fprintf(&b, "-- idemd's version table, as goose creates it\nBEGIN;\n%s;\n%s;\nCOMMIT;\n\n", rec.take(), rec.take())
		}
		for _, m := range idemd {
			pending++
			text, err := fs.ReadFile(Files(), m.file)
			if err != nil {
				return "", fmt.Errorf("migrate: print sql: read %s: %w", m.file, err)
			}
			up, inTx, err := gooseUp(string(text))
			if err != nil {
				return "", fmt.Errorf("migrate: print sql: %s: %w", m.file, err)
			}
			if err := store.Insert(ctx, rec, database.InsertRequest{Version: m.version}); err != nil {
				return "", fmt.Errorf("migrate: print sql: %w", err)
			}
			record := rec.take()
			if inTx {
				fmt.Fprintf(&b, "-- idemd migration %s\nBEGIN;\n%s\n%s;\nCOMMIT;\n\n", m.file, up, record)
			} else {
				fmt.Fprintf(&b, "-- idemd migration %s: NO TRANSACTION (CREATE INDEX CONCURRENTLY); each statement on its own, then its record\n%s\n%s;\n\n", m.file, up, record)
			}
		}
	}
	if pending == 0 {
		return "", nil
	}
	fmt.Fprintf(&b, "-- The grants `idemctl migrate` applies after every run (deploy/sql/grants.sql)\n%s", rolesql.Grants)
	return b.String(), nil
}

// pendingIdemd lists the embedded idemd migrations the database has not
// applied, in order, and says whether goose's version table exists.
func pendingIdemd(ctx context.Context, pool *pgxpool.Pool) (pending []migration, exists bool, err error) {
	all, err := versions()
	if err != nil {
		return nil, false, err
	}
	if err := pool.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", VersionTable).Scan(&exists); err != nil {
		return nil, false, fmt.Errorf("migrate: print sql: %w", err)
	}
	applied := map[int64]bool{}
	if exists {
		rows, err := pool.Query(ctx, appliedIdemdSQL)
		if err != nil {
			return nil, false, fmt.Errorf("migrate: print sql: %w", err)
		}
		vs, err := pgx.CollectRows(rows, pgx.RowTo[int64])
		if err != nil {
			return nil, false, fmt.Errorf("migrate: print sql: %w", err)
		}
		for _, v := range vs {
			applied[v] = true
		}
	}
	for _, m := range all {
		if !applied[m.version] {
			pending = append(pending, m)
		}
	}
	return pending, exists, nil
}

// gooseUp is a goose SQL migration's Up section, with goose's annotations
// (comments to any other tool) left in, and whether goose runs it in a
// transaction.
func gooseUp(text string) (string, bool, error) {
	_, rest, ok := strings.Cut(text, "-- +goose Up")
	if !ok {
		return "", false, errors.New("no -- +goose Up section")
	}
	up, _, _ := strings.Cut(rest, "-- +goose Down")
	return strings.TrimSpace(up), !strings.Contains(text, "-- +goose NO TRANSACTION"), nil
}

// recorder is a goose database.DBTxConn that runs nothing and keeps each
// statement goose's store would run, its two arguments (a version and
// true) written in: the script carries goose's own SQL for its table.
type recorder struct {
	stmts []string
}

func (r *recorder) ExecContext(_ context.Context, query string, args ...any) (sql.Result, error) {
	for i, a := range args {
		var lit string
		switch v := a.(type) {
		case int64:
			lit = fmt.Sprint(v)
		case bool:
			lit = fmt.Sprint(v)
		default:
			return nil, fmt.Errorf("migrate: print sql: goose passed a %T", a)
		}
		query = strings.Replace(query, fmt.Sprintf("$%d", i+1), lit, 1)
	}
	r.stmts = append(r.stmts, strings.TrimSpace(query))
	return nil, nil
}

func (r *recorder) QueryContext(context.Context, string, ...any) (*sql.Rows, error) {
	return nil, errors.New("migrate: print sql: goose asked a query")
}

func (r *recorder) QueryRowContext(context.Context, string, ...any) *sql.Row {
	return nil
}

// take returns the oldest statement recorded and forgets it.
func (r *recorder) take() string {
	s := r.stmts[0]
	r.stmts = r.stmts[1:]
	return s
}
