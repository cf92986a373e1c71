// Package externalmodule proves idem's public surface from outside the
// module, as an API author meets it: its test renders testdata/api (a
// module of its own, example.com/api, whose go.mod requires this module
// under its path and replaces it with this checkout), then builds it, vets
// it and runs its test against a scratch database. The API there opens a
// pool, opens an idem.Store, wraps its handler in ReplayAuth, runs a
// request through phases that stage a job, and has a replay signed with
// replayauth verified; a second package there must not compile, because
// it reaches for what the public packages keep to themselves.
//
// The templates name this module only through {{.Module}}, which the test
// reads from the checkout's go.mod: renaming the module path needs no
// change here.
package externalmodule
