// Package riverdb is the one place idemd knows River's internals: River's
// driver interface (riverdriver, which River exempts from its semver), the
// shape of river_job that idemd writes and the schema gate's reads of it,
// the move's statement and River's insert notification channel, the rules
// a staged row must meet to become a River job (in Go and in SQL), the
// metadata keys idemd adds to River jobs, and the SQL the rest of idemd
// reads River's tables with. The enqueuer, idem's Stager, migrate,
// dbstats, operator and conformance ask it; conventions_test.go fails
// product code elsewhere that imports riverdriver or writes River's table
// names, channel or idemd's metadata keys, so a River upgrade is a change
// to this package, and its classification tests (classify_test.go) say
// which of River's configuration fields, insert parameters and driver
// methods moved.
package riverdb
