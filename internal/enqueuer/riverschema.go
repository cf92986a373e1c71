package enqueuer

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/idemd/idemd/internal/migrate"
	"github.com/idemd/idemd/internal/riverdb"
)

// The River schema gate. The move writes river_job in SQL (servermove.go)
// and the Go path through River's client (batch.go); both know one table
// shape, the one River's migrations give it at the versions below. The API
// upgrades River on its own schedule, so the enqueuer reads River's schema
// version (river_migration, line "main") and river_job's columns before it
// moves anything, again every riverSchemaRecheck, and whenever a move finds
// the version changed under it (the move itself compares the version in
// the same statement, so no move writes a table a River migration changed
// after the last check). On any other version or shape it moves nothing:
// the staged rows wait where they are, /readyz fails with the reason, the
// gauge idemd_enqueuer_river_schema_supported is 0, the alert
// IdemdEnqueuerRiverSchemaUnsupported fires, and the reason is logged once
// per change.

// The versions of River's schema the move writes are
// migrate.RiverSchemaVersions: migrate applies River's migrations and
// holds every daemon's schema floor, River's included.

// riverSchemaRecheck is how often a supported schema is read again (an
// unsupported one is read at every batch, the failed passes' backoff
// apart). A River
// migration that changes the version between two reads is caught by the
// move's own comparison; this finds a change that kept the version (a
// column added by hand).
const riverSchemaRecheck = 30 * time.Second

// errRiverSchema: River's schema is one the enqueuer does not write.
var errRiverSchema = errors.New("river schema not supported")

// riverGate caches the gate's verdict between checks.
type riverGate struct {
	mu        sync.Mutex
	checked   time.Time
	version   int
	ok        bool
	why       string
	lastState string // what was last logged: "" before the first check
}

// blocked is /readyz's view of the gate: why the enqueuer moves nothing,
// or nil.
func (g *riverGate) blocked() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.checked.IsZero() || g.ok {
		return nil
	}
	return fmt.Errorf("%w: %s", errRiverSchema, g.why)
}

// invalidate makes the next batch read the schema again (a move found the
// version changed).
func (g *riverGate) invalidate() {
	g.mu.Lock()
	defer g.mu.Unlock()
	// Read again at the next batch; the verdict stands until then.
	g.checked = time.Time{}
	g.ok, g.why = false, "re-reading River's schema after a move found it changed"
	g.lastState = ""
}

// riverVersion returns the River schema version the next move may write,
// reading the schema when the last read is older than riverSchemaRecheck;
// an error wrapping errRiverSchema when the schema is not one it writes.
func (s *Service) riverVersion(ctx context.Context) (int, error) {
	g := &s.riverGate
	g.mu.Lock()
	defer g.mu.Unlock()
	// Read again when due, and at every batch while the schema is not
	// supported, so moves resume with the first batch after River's is.
	if !g.ok || g.checked.IsZero() || time.Since(g.checked) >= riverSchemaRecheck {
		var rs riverdb.Schema
		err := s.calls.Do(ctx, "enqueuer river schema", func(ctx context.Context) (err error) {
			rs, err = riverdb.ReadSchema(ctx, s.pool)
			return err
		})
		if err != nil {
			return 0, err
		}
		if !rs.Found && len(rs.Schemas) == 0 {
			// Nothing migrated: the move fails on the missing table, and the
			// daemon says to run `idemctl migrate`, as for any of idemd's
			// tables (daemon.SchemaHint), once.
			return 0, nil
		}
		g.ok, g.why = riverdb.Judge(rs, migrate.RiverSchemaVersions)
		g.version, g.checked = rs.Version, time.Now()
		s.metrics.riverSchemaVersion.Set(float64(rs.Version))
		if g.ok {
			s.metrics.riverSchemaSupported.Set(1)
		} else {
			s.metrics.riverSchemaSupported.Set(0)
		}
		state := "ok"
		if !g.ok {
			state = g.why
		}
		if state != g.lastState {
			// Once per change: a pass retried every few seconds on an
			// unsupported schema says nothing new.
			if g.ok {
				s.logger.Info("River schema supported: moving staged jobs", zap.Int("river_schema_version", rs.Version))
			} else {
				s.logger.Error("River schema not supported: no staged job is moved until it is; they wait in staged_jobs",
					zap.Int("river_schema_version", rs.Version), zap.String("reason", g.why))
			}
			g.lastState = state
		}
	}
	if !g.ok {
		return 0, fmt.Errorf("enqueuer batch: %w: %s", errRiverSchema, g.why)
	}
	return g.version, nil
}
