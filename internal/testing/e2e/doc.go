// Package e2e is the end-to-end fault suite: the real binaries of the
// enqueuer, completer, reaper, idemctl and Rocket Rides against their own
// PostgreSQL cluster, under SIGKILLs, API faults and timeouts, a PostgreSQL
// restart, severed and slowed connections, clock skew and poison rows, and
// the faults that say nothing (a black-holed network, a frozen database, a
// slow link, a half-open connection), then an oracle over SQL and the fake
// Stripe's records. See docs/e2e.md.
//
// The tests carry the build tag e2e, so `go test ./...` does not build them:
//
//	go test -tags e2e -count=1 -timeout 30m ./internal/testing/e2e/
package e2e
