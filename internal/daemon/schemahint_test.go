package daemon

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
)

func undefinedTable(rel string) error {
	return fmt.Errorf("drain: %w", &pgconn.PgError{Severity: "ERROR", Code: "42P01", Message: fmt.Sprintf("relation %q does not exist", rel)})
}

// An undefined_table error on idemd's or River's tables becomes the fix;
// any other error, or another application's table, is left alone.
func TestSchemaHint(t *testing.T) {
	for _, rel := range []string{"staged_jobs", "public.idempotency_keys", "idemd_leases", "idemd_schema_migrations", "river_job"} {
		err := SchemaHint(undefinedTable(rel))
		var m *MissingSchemaError
		if !errors.As(err, &m) || !strings.Contains(err.Error(), "run `idemctl migrate`") {
			t.Errorf("%s: %v, want the migrate hint", rel, err)
			continue
		}
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != "42P01" {
			t.Errorf("%s: the original error is not kept: %v", rel, err)
		}
		if SchemaHint(err) != err {
			t.Errorf("%s: hinted twice", rel)
		}
	}
	for _, err := range []error{
		nil,
		undefinedTable("rides"),
		errors.New(`relation "staged_jobs" does not exist`),
		&pgconn.PgError{Code: "42501", Message: "permission denied for table staged_jobs"},
	} {
		if got := SchemaHint(err); got != err {
			t.Errorf("SchemaHint(%v) = %v, want it unchanged", err, got)
		}
	}
}

// The commands' loggers apply it to every error they log, in fields given
// to a line or to With.
func TestLoggerHintsMissingSchema(t *testing.T) {
	core, logs := observer.New(zapcore.InfoLevel)
	logger := zap.New(core).WithOptions(zap.WrapCore(wrapSchemaHint))
	logger.Error("drain failed", zap.Error(undefinedTable("staged_jobs")), zap.Int("moved", 0))
	logger.With(zap.NamedError("cause", undefinedTable("river_job"))).Warn("pass failed")
	logger.Error("other", zap.Error(undefinedTable("rides")))
	entries := logs.All()
	if len(entries) != 3 {
		t.Fatalf("%d entries", len(entries))
	}
	for i, key := range []string{"error", "cause"} {
		got, _ := entries[i].ContextMap()[key].(string)
		if !strings.HasPrefix(got, "idemd's schema is missing from this database") || !strings.Contains(got, "idemctl migrate") {
			t.Errorf("entry %d %s = %q, want the migrate hint", i, key, got)
		}
	}
	if got := entries[0].ContextMap()["moved"]; got != int64(0) {
		t.Errorf("other fields changed: moved = %v", got)
	}
	if got, _ := entries[2].ContextMap()["error"].(string); strings.Contains(got, "idemctl") {
		t.Errorf("another table's error got the hint: %q", got)
	}
}
