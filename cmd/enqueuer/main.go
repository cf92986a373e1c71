// Command enqueuer moves committed staged jobs into River, exactly once.
// See docs/enqueuer.md.
package main

import (
	"os"

	"github.com/idemd/idemd/internal/daemon"
	"github.com/idemd/idemd/internal/enqueuer"
)

func main() {
	os.Exit(daemon.Main("enqueuer", enqueuer.Description, &enqueuer.Command{}, os.Args[1:]))
}
