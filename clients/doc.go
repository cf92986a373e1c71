// Package clients holds idemd's replay verifiers for APIs that are not
// written in Go, each dependency-free and with the behaviour of
// idem/replayauth and idem.ReplayAuth:
//
//	clients/ruby    Rack middleware        (lib/idemd/replay_auth.rb)
//	clients/python  WSGI and ASGI middleware (idemd_replayauth/)
//	clients/node    Express/connect middleware (replayauth.js)
//
// The Go package has no code: its tests run each language's own tests
// with the language's Debian runtime (scripts/ensure-runtimes.sh installs
// them; with CI=true a missing runtime fails) against the published
// vectors, idem/replayauth/testdata/vectors.json, which TestVectorsFile
// regenerates from idem/replayauth (UPDATE_VECTORS=1) and keeps in step,
// and check that the languages share one nonce table with Go's verifier.
// The guides are docs/languages/{ruby,python,node}.md.
package clients
