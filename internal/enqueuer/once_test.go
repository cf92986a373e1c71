package enqueuer

import (
	"context"
	"io"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/idemd/idemd/internal/config"
	"github.com/idemd/idemd/internal/daemon"
	"github.com/idemd/idemd/internal/opshttp"
	"github.com/idemd/idemd/internal/testing/dbtest"
)

// TestOnceLogsOneSummaryLine: a --once run logs one `enqueuer pass` line
// for its pass, whether it moved rows or none, at info level and at
// debug level (where the pass's own line is written) alike
// (docs/architecture.md).
func TestOnceLogsOneSummaryLine(t *testing.T) {
	dbURL := dbtest.NewDatabase(t)
	ctx := context.Background()
	p, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	for _, level := range []zapcore.Level{zapcore.InfoLevel, zapcore.DebugLevel} {
		for _, rows := range []int{0, 3} {
			if _, err := p.Exec(ctx, `INSERT INTO staged_jobs (job_name, job_args) SELECT 'k', '{}' FROM generate_series(1, $1)`, rows); err != nil {
				t.Fatal(err)
			}
			var c Command
			if _, err := config.Parse("enqueuer", Description, &c, []string{"--database-url", dbURL, "--once"}, io.Discard); err != nil {
				t.Fatal(err)
			}
			core, logs := observer.New(level)
			env := &daemon.Env{Name: "enqueuer", Logger: zap.New(core), Pool: p, Registry: prometheus.NewRegistry(),
				Ready: &opshttp.Readiness{}, Stdout: io.Discard}
			if err := c.Run(ctx, env); err != nil {
				t.Fatal(err)
			}
			lines := logs.FilterMessage("enqueuer pass").All()
			if len(lines) != 1 {
				t.Errorf("%s, %d rows staged: %d summary lines, want 1: %+v", level, rows, len(lines), logs.All())
				continue
			}
			if got := lines[0].ContextMap()["moved"]; got != int64(rows) {
				t.Errorf("%s, %d rows staged: the line says moved %v", level, rows, got)
			}
		}
	}
}
