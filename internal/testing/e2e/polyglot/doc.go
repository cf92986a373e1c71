// Package polyglot is the cross-language end-to-end test (docs/e2e.md's
// suite is Go's; this one is an API in another language): a minimal order
// API built on idemd's schema contract, in Python
// (clients/python/example/orders_api.py, standard library and psycopg2)
// and in Ruby (clients/ruby/example/orders_api.rb, WEBrick and ruby-pg),
// one test run against each, with requests abandoned mid-way by clients
// that give up and by a SIGKILLed process, finished by the real completer
// binary through that language's replay verifier, and their staged jobs
// moved into River by the real enqueuer binary; forged and replayed
// signatures are refused. Build tag e2e:
//
//	go test -tags e2e -count=1 ./internal/testing/e2e/polyglot/
package polyglot
