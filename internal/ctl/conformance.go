package ctl

import (
	"context"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/idemd/idemd/idem/replayauth"
	"github.com/idemd/idemd/internal/config"
	"github.com/idemd/idemd/internal/conformance"
)

// ConformanceCmd checks a running API against the idempotency-key
// protocol (internal/conformance, docs/conformance.md). It is the one
// command whose database is optional: without --database-url it checks
// what a client sees, with it also what the API wrote.
type ConformanceCmd struct {
	APIURL                 string        `name:"api-url" help:"Base URL of the running API (as the completer's --api-url). Required."`
	Request                string        `name:"request" help:"JSON file describing one request of the API that succeeds for a test user: method, path, headers (its authentication), body; optionally encoding, alt_body, second_user (docs/conformance.md). Required."`
	AuthSecretFile         string        `name:"auth-secret-file" help:"The completer's replay secret file: with it (and --database-url) the signed-replay scenarios run. Read as the completer reads it, never printed."`
	AuthSecretFilePrevious string        `name:"auth-secret-file-previous" help:"The previous secret during a rotation; replays are then signed with both, as the completer does."`
	MismatchStatus         int           `name:"mismatch-status" help:"Require this status for a reused key with other parameters: 400 (Stripe's), 409 (the article's) or 422 (the IETF draft's, idem's). Without it any of the three passes, and the report says which the API answered."`
	Concurrency            int           `name:"concurrency" default:"8" help:"Requests sent at once with one key in the concurrent scenario."`
	RequestTimeout         time.Duration `name:"request-timeout" default:"10s" help:"Timeout of each request."`
	Scenario               []string      `name:"scenario" help:"Run only these scenarios (repeat, or comma-separated)."`
	JUnit                  string        `name:"junit" help:"Also write the results as JUnit XML to this file, for CI."`
	Output

	selected bool
}

// BeforeApply is kong's hook, called when the command is on the command
// line: idemctl then runs without a database (CLI.Check).
func (c *ConformanceCmd) BeforeApply() error {
	c.selected = true
	return nil
}

// Validate reports every problem with the flags (exit 2).
func (c *ConformanceCmd) Validate() error {
	var p []string
	if strings.TrimSpace(c.APIURL) == "" {
		p = append(p, "--api-url is required")
	}
	if strings.TrimSpace(c.Request) == "" {
		p = append(p, "--request is required")
	}
	if _, ok := conformance.MismatchStatuses[c.MismatchStatus]; c.MismatchStatus != 0 && !ok {
		p = append(p, fmt.Sprintf("--mismatch-status %d: must be 400, 409 or 422", c.MismatchStatus))
	}
	if c.Concurrency < 2 || c.Concurrency > 256 {
		p = append(p, fmt.Sprintf("--concurrency %d: must be between 2 and 256", c.Concurrency))
	}
	if c.RequestTimeout <= 0 {
		p = append(p, "--request-timeout must be positive")
	}
	if c.AuthSecretFilePrevious != "" && c.AuthSecretFile == "" {
		p = append(p, "--auth-secret-file-previous needs --auth-secret-file")
	}
	return problems(p)
}

// Run runs the scenarios, prints the report and fails (exit 1) unless
// every scenario that ran passed.
func (c *ConformanceCmd) Run(ctx context.Context, g *Globals) error {
	tmpl, err := conformance.ReadTemplate(c.Request)
	if err != nil {
		return &config.Error{Problems: []string{"--request: " + err.Error()}}
	}
	cfg := conformance.Config{
		APIURL: c.APIURL, Template: tmpl, MismatchStatus: c.MismatchStatus,
		Concurrency: c.Concurrency, RequestTimeout: c.RequestTimeout,
	}
	for _, s := range c.Scenario {
		for _, name := range strings.Split(s, ",") {
			if name = strings.TrimSpace(name); name != "" {
				cfg.Only = append(cfg.Only, name)
			}
		}
	}
	if g.HasDatabase {
		cfg.Pool = g.Pool
	}
	if c.AuthSecretFile != "" {
		// As the completer reads them: the errors name the file, never
		// the secret.
		if cfg.Secrets, err = replayauth.ReadSecretFiles(c.AuthSecretFile, c.AuthSecretFilePrevious); err != nil {
			return &config.Error{Problems: []string{"--auth-secret-file: " + err.Error()}}
		}
	}
	if err := cfg.Validate(); err != nil {
		return &config.Error{Problems: []string{strings.TrimPrefix(err.Error(), "conformance: ")}}
	}
	rep, err := conformance.Run(ctx, cfg)
	if err != nil {
		return err
	}
	if c.JUnit != "" {
		if err := writeJUnitFile(c.JUnit, rep); err != nil {
			return err
		}
	}
	if c.JSON() {
		err = writeJSON(g.Stdout, rep)
	} else {
		err = conformance.WriteText(g.Stdout, rep)
	}
	if err != nil {
		return err
	}
	if !rep.OK() {
		return fmt.Errorf("conformance: %d of %d scenarios failed, first %s", rep.Failed, len(rep.Results), rep.FailedNames()[0])
	}
	return nil
}

func writeJUnitFile(path string, rep conformance.Report) error {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("--junit: %w", err)
	}
	if err := conformance.WriteJUnit(f, rep); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("--junit: %w", err)
	}
	return nil
}

// Help implements kong.HelpProvider.
func (c *ConformanceCmd) Help() string {
	return `Sends requests to a running API (use a test environment and a test user: the
scenarios do real work, each on keys of their own) and says, one line per
scenario, whether the API keeps the idempotency-key protocol, why not, and
the section of docs/api-authors.md that says what to do. Exit 0 only when no
scenario failed. The database is optional here: without --database-url
(DATABASE_URL) the scenarios that read the tables are skipped, and without
--auth-secret-file the signed-replay ones. docs/conformance.md describes the
scenarios and the --request file.

Examples:
  idemctl conformance --api-url http://localhost:8080 --request ride.json
                                           what a client sees (no database)
  DATABASE_URL=postgres://api@db/app idemctl conformance \
      --api-url http://localhost:8080 --request ride.json \
      --auth-secret-file /etc/idemd/replay-secret
                                           every scenario: the tables and the completer's path
  idemctl conformance --api-url http://localhost:8080 --request ride.json \
      --junit conformance.xml -o json      for CI
  idemctl conformance --api-url http://localhost:8080 --request ride.json \
      --scenario replay,params-mismatch    only these`
}
