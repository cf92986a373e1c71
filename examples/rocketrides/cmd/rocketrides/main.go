// Command rocketrides serves the Rocket Rides reference API with its fake
// Stripe and receipt worker. See docs/api-authors.md.
package main

import (
	"os"

	"github.com/idemd/idemd/examples/rocketrides/server"
	"github.com/idemd/idemd/internal/daemon"
)

func main() {
	os.Exit(daemon.Main("rocketrides", server.Description, &server.Command{}, os.Args[1:]))
}
