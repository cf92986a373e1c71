// Package sql embeds the SQL an operator runs by hand (roles.sql), so the
// tests apply exactly the documented file rather than a copy of it.
package sql

import _ "embed"

// Roles is roles.sql: idemd_migrator, idemd_runtime and idemd_api, their
// grants and the migrator's default privileges, for the database it runs in.
//
//go:embed roles.sql
var Roles string

// Role names created by Roles.
const (
	MigratorRole = "idemd_migrator"
	RuntimeRole  = "idemd_runtime"
	APIRole      = "idemd_api"
)
