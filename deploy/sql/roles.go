// Package sql embeds idemd's role SQL: roles.sql, which an operator runs
// once, and grants.sql, which `idemctl migrate` applies after every run, so
// the tests and the migrator apply exactly the documented files.
package sql

import _ "embed"

// Roles is roles.sql: idemd_migrator, idemd_runtime and idemd_api, their
// grants and the migrator's default privileges, for the database it runs in.
//
//go:embed roles.sql
var Roles string

// Grants is grants.sql: the per-table grants on idemd's tables for
// idemd_runtime and idemd_api, applied by their owner after a migration.
//
//go:embed grants.sql
var Grants string

// RiverGrants is river-grants.sql: what River's owner grants idemd's roles
// where River's tables belong to the API's role, not to idemd_migrator.
//
//go:embed river-grants.sql
var RiverGrants string

// RuntimeRolesInTurn is runtime-roles-in-turn.sql: idemd_runtime_a and
// idemd_runtime_b, members of idemd_runtime, for a rotation that changes
// role each time.
//
//go:embed runtime-roles-in-turn.sql
var RuntimeRolesInTurn string

// Role names created by Roles.
const (
	MigratorRole = "idemd_migrator"
	RuntimeRole  = "idemd_runtime"
	APIRole      = "idemd_api"
)
