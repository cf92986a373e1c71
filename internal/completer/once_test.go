package completer

import (
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

// TestOnceLogsOneSummaryLine: a --once run logs one summary line for its
// pass, whether the pass had keys to work (the skeleton's line) or none
// (the command's), never both (docs/architecture.md).
func TestOnceLogsOneSummaryLine(t *testing.T) {
	dbURL := dbtest.NewDatabase(t)
	pool, err := pgxpool.New(t.Context(), dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	api := newTestAPI(t, pool, always(actFinish))
	for _, keys := range []int{0, 3} {
		insertKeys(t, pool, "once", keys, "started")
		var c Command
		if _, err := config.Parse("completer", Description, &c, []string{
			"--database-url", dbURL, "--api-url", api.srv.URL, "--auth-secret-file", writeSecret(t, testSecret),
			"--grace", "0s", "--idle", "0s", "--lock-timeout", "0s", "--once",
		}, io.Discard); err != nil {
			t.Fatal(err)
		}
		core, logs := observer.New(zapcore.InfoLevel)
		env := &daemon.Env{Name: "completer", Logger: zap.New(core), Pool: pool, Registry: prometheus.NewRegistry(),
			Ready: &opshttp.Readiness{}, Stdout: io.Discard}
		if err := c.Run(t.Context(), env); err != nil {
			t.Fatal(err)
		}
		lines := logs.FilterMessage("completer pass").All()
		if len(lines) != 1 {
			t.Errorf("%d keys due: %d summary lines, want 1: %+v", keys, len(lines), logs.All())
			continue
		}
		if got := lines[0].ContextMap()["claimed"]; got != int64(keys) {
			t.Errorf("%d keys due: the line says claimed %v", keys, got)
		}
	}
}
