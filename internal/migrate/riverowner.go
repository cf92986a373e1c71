package migrate

import (
	"context"
	"fmt"
	"log/slog"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemd/idemd/internal/riverdb"
)

// River's tables may exist before idemd: an API written with River ran
// River's migrations with its own role and upgrades River on its own
// schedule. idemd does not take them over. `idemctl migrate` applies
// River's migrations only where it owns River's tables (it created them,
// or its role may act as their owner); otherwise it leaves River to its
// owner, says so, and applies idemd's own. The enqueuer's River schema
// gate then checks that the River version the owner keeps is one it
// writes, and River's owner grants idemd's runtime role what it needs on
// River's tables (deploy/sql/river-grants.sql).

// RiverSchemaVersions are the versions of River's main migration line
// idemd was tested with: the newest of the River module it is built with,
// and the one before it, so an API may run River one schema behind. The
// enqueuer writes river_job only at these versions (its River schema
// gate; TestRiverPreviousSchemaAndUpgrade moves jobs at each and compares
// them with River's client's, column for column), and every daemon's
// /readyz needs at least the oldest (Inspect). TestRiverSchemaVersions
// fails when a River upgrade brings a migration not listed here.
var RiverSchemaVersions = []int{7, 8}

// riverTables is what migrate found of River before running.
type riverTables struct {
	// onPath: river_migration resolves on the search path.
	onPath bool
	// ours: the running role may act as river_migration's owner.
	ours  bool
	owner string
	// schemas holding a river_migration table, wherever they are.
	schemas []string
	// version is River's main-line version, when readable (-1 if not).
	version int
}

// riverAction is what migrate does with River.
type riverAction int

const (
	riverMigrate riverAction = iota // apply River's migrations
	riverLeave                      // River belongs to another role: leave it
)

// decideRiver is the pure decision: migrate River, leave it to its owner,
// or refuse (River's tables in a schema the role does not resolve, where
// River's migrator would create a second River in the first schema of the
// search path).
func decideRiver(r riverTables) (riverAction, error) {
	switch {
	case !r.onPath && len(r.schemas) > 0:
		return 0, fmt.Errorf("migrate: River's tables are in schema %s, which is not on the search path of the migrating role; "+
			"idemd supports River in the schema its roles resolve first: put it first on the search path of idemd's roles "+
			"(ALTER ROLE idemd_migrator IN DATABASE <db> SET search_path = %s, public, and the same for idemd_runtime), "+
			"or River's migrations here would create a second River", strings.Join(r.schemas, ", "), r.schemas[0])
	case !r.onPath, r.ours:
		return riverMigrate, nil
	default:
		return riverLeave, nil
	}
}

// readRiverTables reads riverTables, and River's version where the role
// may read it.
func readRiverTables(ctx context.Context, pool *pgxpool.Pool) (riverTables, error) {
	var r riverTables
	if err := pool.QueryRow(ctx, riverdb.MigrationTablesSQL).Scan(&r.onPath, &r.ours, &r.owner, &r.schemas, &r.version); err != nil {
		return r, fmt.Errorf("migrate: find River's tables: %w", err)
	}
	if r.version == -2 {
		if err := pool.QueryRow(ctx, riverdb.VersionSQL).Scan(&r.version); err != nil {
			return r, fmt.Errorf("migrate: read River's version: %w", err)
		}
	}
	return r, nil
}

// leaveRiver logs, once per run, that River is its owner's.
func leaveRiver(logger *slog.Logger, r riverTables) {
	if r.version < 0 {
		logger.Warn("migrate: River's tables belong to another role, which runs River's migrations; idemd leaves them to it, "+
			"but may not read river_migration: have River's owner run deploy/sql/river-grants.sql", "river_owner", r.owner)
		return
	}
	logger.Info("migrate: River's tables belong to another role, which runs River's migrations; idemd leaves them to it "+
		"(the enqueuer checks that River's version is one it writes)", "river_owner", r.owner, "river_version", r.version)
}
