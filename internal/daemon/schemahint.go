package daemon

import (
	"errors"
	"fmt"
	"io/fs"
	"regexp"
	"strings"
	"sync"

	"github.com/jackc/pgx/v5/pgconn"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/idemd/idemd/internal/migrate"
)

// MissingSchemaError is an error PostgreSQL raised because a table of
// idemd's schema (or River's, which `idemctl migrate` also applies) does
// not exist: the database was never migrated, or not by this version. Its
// message leads with the fix.
type MissingSchemaError struct {
	Table string
	Err   error // the original error, with its SQLSTATE 42P01
}

func (e *MissingSchemaError) Error() string {
	return fmt.Sprintf("idemd's schema is missing from this database (no table %s): run `idemctl migrate` against it first", e.Table)
}

func (e *MissingSchemaError) Unwrap() error { return e.Err }

// SchemaHint returns err as a *MissingSchemaError when it is (or wraps) an
// undefined_table error (42P01) on one of idemd's or River's tables, and
// err unchanged otherwise. Every command's logger applies it to the errors
// it logs; a command that prints an error itself can call it.
func SchemaHint(err error) error {
	var m *MissingSchemaError
	if err == nil || errors.As(err, &m) {
		return err
	}
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "42P01" {
		return err
	}
	sub := undefinedRelation.FindStringSubmatch(pgErr.Message)
	if sub == nil || !isSchemaTable(sub[1]) {
		return err
	}
	return &MissingSchemaError{Table: sub[1], Err: err}
}

// undefinedRelation reads PostgreSQL's 42P01 message, schema-qualified or
// not: relation "staged_jobs" does not exist.
var undefinedRelation = regexp.MustCompile(`relation "(?:[^".]+\.)?([^"]+)" does not exist`)

// createTable finds the tables idemd's migrations create.
var createTable = regexp.MustCompile(`(?i)CREATE\s+(?:UNLOGGED\s+)?TABLE\s+(?:IF\s+NOT\s+EXISTS\s+)?(?:[a-z_]+\.)?"?([a-z_][a-z0-9_]*)`)

// schemaTables is read once from the migrations the binary carries, so a
// table a new migration adds is known without a list to keep.
var schemaTables = sync.OnceValue(func() map[string]bool {
	tables := map[string]bool{migrate.VersionTable: true}
	files, _ := fs.Glob(migrate.Files(), "*.sql")
	for _, f := range files {
		b, err := fs.ReadFile(migrate.Files(), f)
		if err != nil {
			continue
		}
		for _, m := range createTable.FindAllStringSubmatch(string(b), -1) {
			tables[strings.ToLower(m[1])] = true
		}
	}
	return tables
})

func isSchemaTable(name string) bool {
	return strings.HasPrefix(name, "river_") || schemaTables()[name]
}

// wrapSchemaHint wraps a logger's core so that every error field goes
// through SchemaHint: an operator who started a daemon on an unmigrated
// database reads the fix, not `relation "staged_jobs" does not exist`.
func wrapSchemaHint(c zapcore.Core) zapcore.Core { return schemaHintCore{c} }

type schemaHintCore struct{ zapcore.Core }

func (c schemaHintCore) With(fields []zapcore.Field) zapcore.Core {
	return schemaHintCore{c.Core.With(hintFields(fields))}
}

func (c schemaHintCore) Check(e zapcore.Entry, ce *zapcore.CheckedEntry) *zapcore.CheckedEntry {
	if c.Enabled(e.Level) {
		return ce.AddCore(e, c)
	}
	return ce
}

func (c schemaHintCore) Write(e zapcore.Entry, fields []zapcore.Field) error {
	return c.Core.Write(e, hintFields(fields))
}

// hintFields returns fields with every missing-schema error replaced,
// copying only when one is.
func hintFields(fields []zapcore.Field) []zapcore.Field {
	out, copied := fields, false
	for i, f := range fields {
		err, ok := f.Interface.(error)
		if f.Type != zapcore.ErrorType || !ok {
			continue
		}
		if hinted := SchemaHint(err); hinted != err {
			if !copied {
				out, copied = append([]zapcore.Field(nil), fields...), true
			}
			out[i] = zap.NamedError(f.Key, hinted)
		}
	}
	return out
}
