package daemon

import (
	"context"
	"sync/atomic"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/idemd/idemd/internal/buildinfo"
	"github.com/idemd/idemd/internal/migrate"
)

// SchemaFloor is implemented by a command that runs on databases older than
// the newest schema its binary ships. A command without it needs every
// migration the binary ships.
type SchemaFloor interface {
	// OldestSchema is the lowest idemd migration version the command runs
	// on: below it, /readyz fails and names `idemctl migrate`.
	OldestSchema() int64
}

// oldestSchema is the lowest schema version cmd runs on.
func oldestSchema(cmd any) int64 {
	if f, ok := cmd.(SchemaFloor); ok {
		return f.OldestSchema()
	}
	return migrate.Newest()
}

// registerBuildInfo exports idemd_build_info, so a dashboard or an alert
// can tell which release each replica runs (during a rollout, two).
func registerBuildInfo(reg prometheus.Registerer, service string) {
	g := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "idemd_build_info",
		Help: "Always 1; its labels are the release (version), the source commit, the Go version and the command (service) of this process.",
		ConstLabels: prometheus.Labels{
			"version": buildinfo.Version(), "commit": buildinfo.Commit(),
			"goversion": buildinfo.GoVersion(), "service": service,
		},
	})
	g.Set(1)
	reg.MustRegister(g)
}

// schemaWatch is the readiness check of the database schema: it fails below
// the command's oldest schema, and above the binary's newest it stays ready
// (idemd's migrations are additive: migrate.Schema.Note) but says so in
// /readyz, a gauge and, once per process, a warning in the log.
type schemaWatch struct {
	pool   *pgxpool.Pool
	oldest int64
	logger *zap.Logger

	database prometheus.Gauge
	newer    prometheus.Gauge
	warned   atomic.Bool
	note     atomic.Pointer[string]
}

func newSchemaWatch(pool *pgxpool.Pool, oldest int64, logger *zap.Logger, reg prometheus.Registerer) *schemaWatch {
	version := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "idemd_schema_version",
		Help: "idemd schema versions (migration numbers): of=\"database\" the highest applied, as /readyz last read it (0 before it could); of=\"binary_oldest\" and of=\"binary_newest\" the range this process runs on.",
	}, []string{"of"})
	w := &schemaWatch{
		pool: pool, oldest: oldest, logger: logger,
		database: version.WithLabelValues("database"),
		newer: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "idemd_schema_newer_than_binary",
			Help: "1 when the database has idemd migrations this binary does not ship (a newer release migrated it: safe, the migrations are additive), as /readyz last read it.",
		}),
	}
	version.WithLabelValues("binary_oldest").Set(float64(oldest))
	version.WithLabelValues("binary_newest").Set(float64(migrate.Newest()))
	reg.MustRegister(version, w.newer)
	return w
}

// check is opshttp.Readiness.Schema.
func (w *schemaWatch) check(ctx context.Context) error {
	s, err := migrate.Inspect(ctx, w.pool, w.oldest)
	if err != nil {
		return err
	}
	w.database.Set(float64(s.Database))
	note := s.Note()
	w.note.Store(&note)
	if !s.NewerThanBinary() {
		w.newer.Set(0)
		return s.Err()
	}
	w.newer.Set(1)
	if w.warned.CompareAndSwap(false, true) {
		w.logger.Warn(note, zap.Int64("schema_version", s.Database), zap.Int64s("unknown_migrations", s.Unknown),
			zap.Int64("binary_newest_schema", s.Newest))
	}
	return s.Err()
}

// readyNote is opshttp.Readiness.Note: what the last check found worth
// saying about a schema the process runs on.
func (w *schemaWatch) readyNote() string {
	if n := w.note.Load(); n != nil {
		return *n
	}
	return ""
}
