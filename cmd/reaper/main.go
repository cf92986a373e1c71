// Command reaper deletes idempotency keys past the retention window and
// flags the unfinished ones for review. See docs/reaper.md.
package main

import (
	"os"

	"github.com/idemd/idemd/internal/daemon"
	"github.com/idemd/idemd/internal/reaper"
)

func main() {
	os.Exit(daemon.Main("reaper", reaper.Description, &reaper.Command{}, os.Args[1:]))
}
