// Command completer drives abandoned idempotency keys to finished by
// replaying their stored requests against the API through the signed
// internal path. See docs/completer.md.
package main

import (
	"os"

	"github.com/idemd/idemd/internal/completer"
	"github.com/idemd/idemd/internal/daemon"
)

func main() {
	os.Exit(daemon.Main("completer", completer.Description, &completer.Command{}, os.Args[1:]))
}
