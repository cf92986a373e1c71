// Package clienttest is what the Go tests of the other-language clients
// share (clients' own tests and the cross-language end-to-end test,
// internal/testing/e2e/polyglot): finding Debian's language runtimes, a database
// with a login role of the API's group role, and running a language's
// test command.
package clienttest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemd/idemd/internal/testing/dbtest"
)

// Root returns the module's root directory (where go.mod is), found upwards
// from the test's working directory.
func Root(tb testing.TB) string {
	tb.Helper()
	dir, err := os.Getwd()
	if err != nil {
		tb.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			tb.Fatal("clienttest: no go.mod above the working directory")
		}
		dir = parent
	}
}

// missing fails the test under CI=true (CI must have every runtime: .ci/run
// runs scripts/ensure-runtimes.sh) and skips it elsewhere.
func missing(tb testing.TB, what string) {
	tb.Helper()
	msg := what + " (scripts/ensure-runtimes.sh installs Debian's packages)"
	if os.Getenv("CI") == "true" {
		tb.Fatal("clienttest: " + msg)
	}
	tb.Skip("clienttest: " + msg)
}

// works reports whether bin runs args with exit code 0.
func works(bin string, args ...string) bool {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return exec.CommandContext(ctx, bin, args...).Run() == nil
}

// Python returns Debian's python3 (/usr/bin/python3, ahead of a pyenv or
// other python3 earlier on PATH) with psycopg2 and Flask (the Flask
// example's test) importable.
func Python(tb testing.TB) string {
	tb.Helper()
	cands := []string{"/usr/bin/python3"}
	if p, err := exec.LookPath("python3"); err == nil {
		cands = append(cands, p)
	}
	for _, c := range cands {
		if works(c, "-c", "import psycopg2, flask") {
			return c
		}
	}
	missing(tb, "no python3 with psycopg2 and flask (Debian: python3, python3-psycopg2, python3-flask)")
	return ""
}

// Ruby returns ruby with the pg gem, minitest and WEBrick, which the
// example API serves with, and Sinatra and Sequel, which the Sinatra
// example's test loads (Debian: ruby, ruby-pg, ruby-webrick, ruby-sinatra,
// ruby-sequel).
func Ruby(tb testing.TB) string {
	tb.Helper()
	if p, err := exec.LookPath("ruby"); err == nil && works(p, "-e", `require "pg"; require "minitest"; require "openssl"; require "webrick"; require "sinatra/base"; require "sequel"`) {
		return p
	}
	missing(tb, "no ruby with the pg gem, minitest, webrick, sinatra and sequel (Debian: ruby, ruby-pg, ruby-webrick, ruby-sinatra, ruby-sequel)")
	return ""
}

// Node returns node (Debian: nodejs), version 18 or later for node:test.
func Node(tb testing.TB) string {
	tb.Helper()
	if p, err := exec.LookPath("node"); err == nil && works(p, "-e", `require("node:test"); if (+process.versions.node.split(".")[0] < 18) process.exit(1)`) {
		return p
	}
	missing(tb, "no node 18 or later (Debian: nodejs)")
	return ""
}

// NodePackages makes sure dir's npm install has the packages (the Express
// example's express and pg: scripts/ensure-runtimes.sh runs npm ci there).
func NodePackages(tb testing.TB, node, dir string, pkgs ...string) {
	tb.Helper()
	for _, p := range pkgs {
		if !works(node, "-e", "require.resolve(process.argv[1], { paths: [process.argv[2]] })", p, dir) {
			missing(tb, "no "+p+" in "+dir+"/node_modules (npm ci there)")
		}
	}
}

// Psql returns psql, which the Node tests use as their PostgreSQL driver
// (Debian's node-pg cannot be installed beside a nodejs from elsewhere).
func Psql(tb testing.TB) string {
	tb.Helper()
	if p, err := exec.LookPath("psql"); err == nil {
		return p
	}
	missing(tb, "no psql (Debian: postgresql-client)")
	return ""
}

// DB is a fresh migrated database and a login role of its own that is a
// member of idemd_api (deploy/sql/roles.sql), as an API's role is in
// production, with CREATE on schema public for the API's own tables.
type DB struct {
	URL      string // as dbtest.RuntimeRole, the daemons' role
	APIURL   string // as the API's role
	AdminURL string // as the server's admin, for faults a test sets up
	Role     string // the API role's name
}

// NewAPIDatabase creates the database and the role; both are dropped when
// the test ends.
func NewAPIDatabase(tb testing.TB) DB {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dbURL := dbtest.NewDatabase(tb)
	adminURL := dbtest.AdminURL(tb, dbURL)
	admin, err := pgx.Connect(ctx, adminURL)
	if err != nil {
		tb.Fatal(err)
	}
	defer admin.Close(context.Background())
	// Roles belong to the server: the database's name is unique to this
	// test, and so is a role named after it.
	var role string
	if err := admin.QueryRow(ctx, "SELECT current_database() || '_api'").Scan(&role); err != nil {
		tb.Fatal(err)
	}
	r := pgx.Identifier{role}.Sanitize()
	password := ""
	stmts := []string{
		"CREATE ROLE " + r + " LOGIN IN ROLE " + dbtest.APIRole,
		"GRANT CREATE ON SCHEMA public TO " + r,
	}
	if u, err := url.Parse(adminURL); err == nil && u.User != nil {
		if _, ok := u.User.Password(); ok {
			b := make([]byte, 12)
			_, _ = rand.Read(b)
			password = hex.EncodeToString(b)
			stmts = append(stmts, "ALTER ROLE "+r+" PASSWORD '"+password+"'")
		}
	}
	for _, q := range stmts {
		if _, err := admin.Exec(ctx, q); err != nil {
			tb.Fatalf("%s: %v", q, err)
		}
	}
	tb.Cleanup(func() {
		// Before the database is dropped (cleanups run last first): a
		// role holding privileges or owning objects cannot be dropped.
		ctx := context.Background()
		conn, err := pgx.Connect(ctx, adminURL)
		if err != nil {
			tb.Errorf("drop role %s: %v", role, err)
			return
		}
		defer conn.Close(ctx)
		for _, q := range []string{"DROP OWNED BY " + r, "DROP ROLE " + r} {
			if _, err := conn.Exec(ctx, q); err != nil {
				tb.Errorf("%s: %v", q, err)
			}
		}
	})
	u, err := url.Parse(dbURL)
	if err != nil {
		tb.Fatal(err)
	}
	if password != "" {
		u.User = url.UserPassword(role, password)
	} else {
		u.User = url.User(role)
	}
	return DB{URL: dbURL, APIURL: u.String(), AdminURL: adminURL, Role: role}
}

// Run runs a language's test command in dir with env added, logs its
// output, and fails the test when it exits non-zero or outlasts timeout.
func Run(tb testing.TB, dir string, env []string, timeout time.Duration, bin string, args ...string) string {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	cmd.WaitDelay = 5 * time.Second
	start := time.Now()
	out, err := cmd.CombinedOutput()
	tb.Logf("%s %s (%s, %.1fs):\n%s", filepath.Base(bin), strings.Join(args, " "), dir, time.Since(start).Seconds(), out)
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		tb.Fatalf("%s did not finish within %s", filepath.Base(bin), timeout)
	}
	if err != nil {
		tb.Fatalf("%s %s: %v", filepath.Base(bin), strings.Join(args, " "), err)
	}
	return string(out)
}
