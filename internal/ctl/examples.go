package ctl

// Each command's Help (kong's HelpProvider) is the detailed text its
// --help prints under the flags' summary: examples to copy. DATABASE_URL
// is assumed set (the runtime role's URL; migrate takes the migrator's).

// Help implements kong.HelpProvider.
func (c *CLI) Help() string {
	return `Examples:
  idemctl status                           what the daemons have left to do
  idemctl review list -o json              the open reviews, for a script
  idemctl keys show --user-id 42 --key k1  one key and what happened to it
  idemctl console --operator alice         the web console on 127.0.0.1:8080
  idemctl conformance --api-url http://localhost:8080 --request ride.json
                                           does the API keep the protocol?

Every flag is also an environment variable IDEMD_<FLAG> (shown as $IDEMD_...
in each command's --help), except what a write command changes: its ids and
keys come from the command line only. Who acts (IDEMD_OPERATOR) and why
(IDEMD_NOTE) may come from the environment, and the command says which did.
The database URL is DATABASE_URL.`
}

// Help implements kong.HelpProvider.
func (m *MigrateCmd) Help() string {
	return `Applies River's and idemd's migrations, then the grants on their tables
(deploy/sql/grants.sql), as the tables' owner. Run it as idemd_migrator after
deploy/sql/roles.sql has run once (docs/operations.md, "Database roles").

Examples:
  DATABASE_URL=postgres://idemd_migrator@db:5432/app idemctl migrate
  idemctl migrate --lock-wait 10m          wait longer for a concurrent run, or a table's lock
  idemctl migrate --ddl-lock-timeout 500ms hold the API's statements at most 500ms behind a lock request
  idemctl migrate --adopt-article-schema   also move the article's JSONB body to TEXT`
}

// Help implements kong.HelpProvider.
func (c *StatusCmd) Help() string {
	return `--retention and --lock-window are the reaper's own flags, with its
defaults: give them the values the reaper runs with (the console's pod has
them in IDEMD_RETENTION), and "keys past retention" is what its next run
deletes.

Examples:
  idemctl status
  idemctl status -o json | jq .staged_jobs
  idemctl status --retention 168h          as a reaper with --retention 168h sees it`
}

// Help implements kong.HelpProvider.
func (c *ReviewListCmd) Help() string {
	return `Examples:
  idemctl review list
  idemctl review list --reason completer_gave_up --older-than 24h
  idemctl review list --state all -o json`
}

// Help implements kong.HelpProvider.
func (c *ReviewResolveCmd) Help() string {
	return `Examples:
  idemctl review resolve 17 --by alice --note "refunded the duplicate charge"
  IDEMD_OPERATOR=alice idemctl review resolve 17 --note "customer confirmed"`
}

// Help implements kong.HelpProvider.
func (c *KeysShowCmd) Help() string {
	return `Examples:
  idemctl keys show --id 123456
  idemctl keys show --user-id 42 --key 5e2c9b4e-checkout -o json`
}

// Help implements kong.HelpProvider.
func (c *KeysRetryCmd) Help() string {
	return `Examples:
  idemctl keys retry --id 123456 --by alice --note "payment provider back up"`
}

// Help implements kong.HelpProvider.
func (c *DeadListCmd) Help() string {
	return `Examples:
  idemctl dead list
  idemctl dead list --reason unknown_kind --kind send_receipt -o json`
}

// Help implements kong.HelpProvider.
func (c *DeadShowCmd) Help() string {
	return `Examples:
  idemctl dead show 88001
  idemctl dead show 88001 -o json`
}

// Help implements kong.HelpProvider.
func (c *DeadRequeueCmd) Help() string {
	return `Examples:
  idemctl dead requeue 88001 88002 --by alice --note "receipts v2 worker deployed"`
}

// Help implements kong.HelpProvider.
func (c *ReaperRunsCmd) Help() string {
	return `Examples:
  idemctl reaper runs
  idemctl reaper runs -n 5 -o json`
}

// Help implements kong.HelpProvider.
func (c *ReaperPauseCmd) Help() string {
	return `A running run stops before its next batch (the batch in progress commits
first); runs that start while paused wait before their first. Each wait
counts against --max-runtime. idemctl reaper runs shows the pause in force.

Examples:
  idemctl reaper pause --by alice --note "standby rebuild until 14:00"
  IDEMD_OPERATOR=alice idemctl reaper pause --note "incident 42: primary overloaded"`
}

// Help implements kong.HelpProvider.
func (c *ReaperResumeCmd) Help() string {
	return `Examples:
  idemctl reaper resume --by alice --note "standby rebuilt"`
}

// Help implements kong.HelpProvider.
func (c *ConsoleCmd) Help() string {
	return `Examples:
  idemctl console --operator alice         for one person, on 127.0.0.1:8080
  idemctl console --read-only              pages only
  kubectl -n idemd port-forward deploy/idemd-console 8080
                                           the deployed console (read-only)
  idemctl console --listen 0.0.0.0:8080 --operator-header X-Forwarded-Email
                                           behind an authenticating proxy`
}

// Help implements kong.HelpProvider.
func (c *HelpCmd) Help() string {
	return `Examples:
  idemctl help                             the commands
  idemctl help keys retry                  the same as idemctl keys retry --help`
}

// Help implements kong.HelpProvider.
func (c *VersionCmd) Help() string {
	return `Examples:
  idemctl version                          idemctl 0.2.0 (commit abc1234, go1.26.8)`
}
