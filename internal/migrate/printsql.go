package migrate

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io/fs"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pressly/goose/v3/database"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"

	rolesql "github.com/idemd/idemd/deploy/sql"
)

// PendingSQL is what Up would do to the database pool reaches, as SQL a
// team applies with its own tool (psql, Flyway, Atlas, goose, Rails)
// instead of `idemctl migrate`: River's pending migrations, then idemd's,
// each followed by the statement that records it as applied (in
// river_migration and in VersionTable, as River and goose write them), so
// that afterwards Check finds nothing pending and the daemons start; then
// the settings and grants Up applies on every run. It is "" when nothing
// is pending. It changes nothing.
//
// Each migration that runs in a transaction under Up is one here, with its
// version record; idemd's NO TRANSACTION migrations (CREATE INDEX
// CONCURRENTLY) are statements on their own, as Up runs them, and must not
// be wrapped in a transaction by the tool that applies them. Up's lock
// retries and its advisory lock are not part of the SQL: the tool's own
// locking applies.
func PendingSQL(ctx context.Context, pool *pgxpool.Pool) (string, error) {
	var b strings.Builder
	river, err := pendingRiverSQL(ctx, pool, &b)
	if err != nil {
		return "", err
	}
	idemd, err := pendingIdemdSQL(ctx, pool, &b)
	if err != nil {
		return "", err
	}
	if river+idemd == 0 {
		return "", nil
	}
	b.WriteString("-- River's GIN indexes on river_job keep no pending list (fastupdate = off): migration 00020 says why,\n")
	b.WriteString("-- and idemctl migrate puts it right after every River migration that rebuilds one.\n")
	b.WriteString("DO $idemd$\nDECLARE idx text;\nBEGIN\n  FOR idx IN " + strings.TrimSpace(riverGINPendingSQL) +
		"\n  LOOP\n    EXECUTE 'ALTER INDEX ' || idx || ' SET (fastupdate = off)';\n  END LOOP;\nEND\n$idemd$;\n\n")
	b.WriteString("-- The grants on idemd's and River's tables (deploy/sql/grants.sql), as idemctl migrate applies them.\n")
	b.WriteString(strings.TrimSpace(rolesql.Grants) + "\n")
	header := fmt.Sprintf("-- idemd: %d River and %d idemd migrations pending on this database, from `idemctl migrate --print-sql`.\n"+
		"-- Apply in order as the tables' owner (idemd_migrator), e.g. psql -v ON_ERROR_STOP=1 -f this.sql;\n"+
		"-- afterwards `idemctl migrate` finds nothing pending. Statements outside BEGIN/COMMIT must run outside a transaction.\n\n",
		river, idemd)
	return header + b.String(), nil
}

// riverSchemaTemplate is the placeholder River's migrations carry for a
// schema; idemd uses River's tables in the search path's schema, as Up's
// migrator (no schema configured) does.
const riverSchemaTemplate = "/* TEMPLATE: schema */"

// riverLineColumnAdded is River's migration that adds river_migration.line:
// River records a version below it without the line (versionsInsert).
const riverLineColumnAdded = 5

// pendingRiverSQL writes River's migrations the database lacks, each in a
// transaction with its river_migration row, as River's migrator applies
// them, and returns how many.
func pendingRiverSQL(ctx context.Context, pool *pgxpool.Pool, b *strings.Builder) (int, error) {
	migrator, err := rivermigrate.New(riverpgxv5.New(pool), nil)
	if err != nil {
		return 0, fmt.Errorf("print sql: river migrator: %w", err)
	}
	existing, err := migrator.ExistingVersions(ctx)
	if err != nil {
		return 0, fmt.Errorf("print sql: River's applied migrations: %w", err)
	}
	have := map[int]bool{}
	for _, m := range existing {
		have[m.Version] = true
	}
	n := 0
	for _, m := range migrator.AllVersions() {
		if have[m.Version] {
			continue
		}
		n++
		record := fmt.Sprintf("INSERT INTO river_migration (line, version) VALUES ('main', %d);", m.Version)
		if m.Version < riverLineColumnAdded {
			record = fmt.Sprintf("INSERT INTO river_migration (version) VALUES (%d);", m.Version)
		}
		fmt.Fprintf(b, "-- River migration %03d (%s)\nBEGIN;\n%s\n%s\nCOMMIT;\n\n", m.Version, m.Name,
			strings.TrimSpace(strings.ReplaceAll(m.SQLUp, riverSchemaTemplate, "")), record)
	}
	return n, nil
}

// pendingIdemdSQL writes idemd's migrations the database lacks, after the
// version table goose creates when there is none, and returns how many.
func pendingIdemdSQL(ctx context.Context, pool *pgxpool.Pool, b *strings.Builder) (int, error) {
	known, err := versions()
	if err != nil {
		return 0, err
	}
	store, err := database.NewStore(database.DialectPostgres, VersionTable)
	if err != nil {
		return 0, fmt.Errorf("print sql: goose store: %w", err)
	}
	var exists bool
	if err := pool.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", VersionTable).Scan(&exists); err != nil {
		return 0, fmt.Errorf("print sql: idemd's version table: %w", err)
	}
	applied := map[int64]bool{}
	if exists {
		rows, err := pool.Query(ctx, appliedIdemdSQL)
		if err != nil {
			return 0, fmt.Errorf("print sql: idemd's applied migrations: %w", err)
		}
		for rows.Next() {
			var v int64
			if err := rows.Scan(&v); err != nil {
				rows.Close()
				return 0, fmt.Errorf("print sql: idemd's applied migrations: %w", err)
			}
			applied[v] = true
		}
		if err := rows.Err(); err != nil {
			return 0, fmt.Errorf("print sql: idemd's applied migrations: %w", err)
		}
	}
	var pending []migration
	for _, m := range known {
		if !applied[m.version] {
			pending = append(pending, m)
		}
	}
	if len(pending) == 0 {
		return 0, nil
	}
	if !exists {
		// goose's own statements, as its provider runs them before the
		// first migration: the table, and the row of version 0.
		rec := &recorder{}
		if err := store.CreateVersionTable(ctx, rec); err != nil {
			return 0, fmt.Errorf("print sql: %w", err)
		}
		if err := store.Insert(ctx, rec, database.InsertRequest{Version: 0}); err != nil {
			return 0, fmt.Errorf("print sql: %w", err)
		}
		fmt.Fprintf(b, "-- idemd's version table (goose's), as idemctl migrate creates it\nBEGIN;\n%s\nCOMMIT;\n\n", strings.Join(rec.sql, "\n"))
	}
	for _, m := range pending {
		text, err := fs.ReadFile(Files(), m.file)
		if err != nil {
			return 0, fmt.Errorf("print sql: %w", err)
		}
		up, noTx, err := gooseUp(string(text))
		if err != nil {
			return 0, fmt.Errorf("print sql: %s: %w", m.file, err)
		}
		rec := &recorder{}
		if err := store.Insert(ctx, rec, database.InsertRequest{Version: m.version}); err != nil {
			return 0, fmt.Errorf("print sql: %w", err)
		}
		if noTx {
			fmt.Fprintf(b, "-- idemd migration %s (NO TRANSACTION: each statement on its own, outside a transaction)\n%s\n%s\n\n",
				m.file, up, strings.Join(rec.sql, "\n"))
			continue
		}
		fmt.Fprintf(b, "-- idemd migration %s\nBEGIN;\n%s\n%s\nCOMMIT;\n\n", m.file, up, strings.Join(rec.sql, "\n"))
	}
	return len(pending), nil
}

// gooseUp is the Up section of a goose migration file, its annotations
// left as the SQL comments they are, and whether it is marked NO
// TRANSACTION.
func gooseUp(text string) (string, bool, error) {
	_, rest, ok := strings.Cut(text, "-- +goose Up")
	if !ok {
		return "", false, errors.New("no -- +goose Up")
	}
	up, _, _ := strings.Cut(rest, "-- +goose Down")
	noTx := strings.Contains(text, "-- +goose NO TRANSACTION")
	return strings.TrimSpace(up), noTx, nil
}

// recorder is a goose database.DBTxConn that keeps the statements goose's
// store would send, with their arguments written in as literals, instead of
// sending them: the version table's statements are goose's own.
type recorder struct{ sql []string }

func (r *recorder) ExecContext(_ context.Context, query string, args ...any) (sql.Result, error) {
	for i := len(args); i >= 1; i-- { // $10 before $1
		lit, err := literal(args[i-1])
		if err != nil {
			return nil, err
		}
		query = strings.ReplaceAll(query, "$"+strconv.Itoa(i), lit)
	}
	r.sql = append(r.sql, strings.TrimSpace(query)+";")
	return driverResult{}, nil
}

func (r *recorder) QueryContext(context.Context, string, ...any) (*sql.Rows, error) {
	return nil, errors.New("print sql: goose queried the database")
}

func (r *recorder) QueryRowContext(context.Context, string, ...any) *sql.Row {
	return nil
}

// literal writes a goose argument (a version, a flag) as SQL.
func literal(v any) (string, error) {
	switch v := v.(type) {
	case int64:
		return strconv.FormatInt(v, 10), nil
	case int:
		return strconv.Itoa(v), nil
	case bool:
		return strconv.FormatBool(v), nil
	}
	return "", fmt.Errorf("print sql: goose argument %T", v)
}

type driverResult struct{}

func (driverResult) LastInsertId() (int64, error) { return 0, nil }
func (driverResult) RowsAffected() (int64, error) { return 1, nil }
