// Command enqueuer moves committed staged jobs into River, exactly once.
package main

import (
	"os"

	"idemd/internal/daemon"
	"idemd/internal/enqueuer"
)

func main() {
	os.Exit(daemon.Main("enqueuer", "Move committed rows of staged_jobs into River, exactly once.", &enqueuer.CLI{}, os.Args[1:]))
}
