// Command idemctl is the operator tool: migrate the schema, show status, and
// list and resolve flagged keys.
package main

import (
	"os"

	"github.com/idemd/idemd/internal/ctl"
)

func main() {
	os.Exit(ctl.Main(os.Args[1:], os.Stdout, os.Stderr))
}
