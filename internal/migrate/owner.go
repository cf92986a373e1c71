package migrate

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	rolesql "github.com/idemd/idemd/deploy/sql"
	"github.com/idemd/idemd/internal/dbcall"
	"github.com/idemd/idemd/internal/riverdb"
)

// Every object a migration creates belongs to the role that created it.
// Short-lived login roles (Vault's dynamic users, v-idemd-migr-...) come
// and go: an object owned by one of them stops its DROP ROLE when its lease
// ends, and the next one, which is not its owner, cannot alter it. So the
// migrations run as the group role idemd_migrator (deploy/sql/roles.sql),
// whatever login role connected: a member of it switches to it with SET
// ROLE, and a login role that is not a member (the runtime's credentials
// wired to the migration Job by mistake) is refused before anything runs.
// One login role that is not a member migrates as itself: River's owner,
// the API's long-lived role that installed River and runs its migrations
// (docs/operations.md, "River installed by the API"), whose River idemd
// does not take over.

// ownerState is what the database says of the login role.
type ownerState struct {
	current   string // current_user: the login role, or the role a setting switched to
	superuser bool   // current_user is a superuser
	exists    bool   // the idemd_migrator role exists
	member    bool   // current_user is a member of idemd_migrator (may SET ROLE to it)
	ownsRiver bool   // current_user may act as the owner of River's tables on the search path
	// prepared: idemd_migrator may create in the current schema (roles.sql
	// ran in this database).
	prepared bool
}

const ownerStateSQL = `
SELECT current_user::text,
    coalesce((SELECT rolsuper FROM pg_catalog.pg_roles WHERE rolname = current_user), false),
    to_regrole($1) IS NOT NULL,
    to_regrole($1) IS NOT NULL AND pg_catalog.pg_has_role(current_user, to_regrole($1), 'MEMBER'),
    ` + riverdb.ActsAsOwnerExpr + `,
    to_regrole($1) IS NOT NULL AND current_schema() IS NOT NULL
        AND pg_catalog.has_schema_privilege(to_regrole($1), current_schema(), 'CREATE')`

// RoleError is the refusal of a login role that may not act as
// idemd_migrator: it would create objects that the next migrator cannot
// alter, or it lacks the privileges to migrate at all.
type RoleError struct {
	Login  string
	Reason string
}

func (e *RoleError) Error() string {
	return fmt.Sprintf("migrate: refusing to run as %q: %s", e.Login, e.Reason)
}

// decideOwner returns the role the migrations must SET ROLE to ("" when
// the session already runs as it), or a *RoleError. A superuser on a
// database deploy/sql/roles.sql did not prepare (a development database;
// idemd_migrator may not create there) migrates as itself; where it did, a
// superuser switches to idemd_migrator like any member, so a later
// migrator lease can alter what it created.
func decideOwner(s ownerState, transactionPooler bool) (string, error) {
	switch {
	case s.current == rolesql.MigratorRole:
		return "", nil
	case s.superuser && !s.prepared:
		return "", nil
	case !s.exists:
		return "", &RoleError{Login: s.current, Reason: fmt.Sprintf(
			"the role %s does not exist; run deploy/sql/roles.sql first, then migrate as %s or as a login role that is a member of it (GRANT %s TO <login role>, or Vault's creation statements, docs/operations.md)",
			rolesql.MigratorRole, rolesql.MigratorRole, rolesql.MigratorRole)}
	case !s.member && s.ownsRiver:
		return "", nil
	case !s.member:
		return "", &RoleError{Login: s.current, Reason: fmt.Sprintf(
			"it is not a member of %s, which owns idemd's tables (is the migration Job given the runtime's credentials?); migrate as %s or as a login role created IN ROLE %s",
			rolesql.MigratorRole, rolesql.MigratorRole, rolesql.MigratorRole)}
	case transactionPooler:
		// A session's SET ROLE does not follow a client through a
		// transaction-mode pooler to its next server connection.
		return "", &RoleError{Login: s.current, Reason: fmt.Sprintf(
			"through a transaction-mode pooler (--pooler transaction) SET ROLE %s cannot hold; make it the login role's default (ALTER ROLE <login role> SET role = '%s', as docs/operations.md's Vault creation statements do), or migrate directly or through a session-mode pooler",
			rolesql.MigratorRole, rolesql.MigratorRole)}
	default:
		return rolesql.MigratorRole, nil
	}
}

// ownerRole reads the login role's state on pool and decides (decideOwner).
func ownerRole(ctx context.Context, pool *pgxpool.Pool, transactionPooler bool, calls *dbcall.Bounds) (string, error) {
	var s ownerState
	err := calls.Do(ctx, "migrate: read the login role", func(ctx context.Context) error {
		return pool.QueryRow(ctx, ownerStateSQL, rolesql.MigratorRole).Scan(&s.current, &s.superuser, &s.exists, &s.member, &s.ownsRiver, &s.prepared)
	})
	if err != nil {
		return "", fmt.Errorf("migrate: read the login role: %w", err)
	}
	return decideOwner(s, transactionPooler)
}

// setRoleOnConnect makes cfg's connections SET ROLE to role (nothing when
// role is ""), after cfg's own AfterConnect.
func setRoleOnConnect(cfg *pgxpool.Config, role string) {
	if role == "" {
		return
	}
	prev := cfg.AfterConnect
	cfg.AfterConnect = func(ctx context.Context, conn *pgx.Conn) error {
		if prev != nil {
			if err := prev(ctx, conn); err != nil {
				return err
			}
		}
		if _, err := conn.Exec(ctx, "SET ROLE "+pgx.Identifier{role}.Sanitize()); err != nil {
			return fmt.Errorf("migrate: SET ROLE %s: %w", role, err)
		}
		return nil
	}
}

// OwnerPool is a pool like pool whose connections act as idemd_migrator
// (SET ROLE when the login role is a member of it), for the statements
// around the migrations that create or alter idemd's objects (the
// adoption of an API's schema); it refuses a login role that may not act
// as idemd_migrator with a *RoleError. The caller closes it.
func OwnerPool(ctx context.Context, pool *pgxpool.Pool, transactionPooler bool, calls *dbcall.Bounds) (*pgxpool.Pool, error) {
	role, err := ownerRole(ctx, pool, transactionPooler, calls)
	if err != nil {
		return nil, err
	}
	cfg := pool.Config().Copy()
	setRoleOnConnect(cfg, role)
	owner, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("migrate: open the owner's pool: %w", err)
	}
	return owner, nil
}
