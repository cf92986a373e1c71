//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemd/idemd/examples/rocketrides/simulator"
	"github.com/idemd/idemd/internal/testing/dbtest"
	"github.com/idemd/idemd/internal/testing/e2e/system"
	"github.com/idemd/idemd/internal/testing/release"
	"github.com/idemd/idemd/internal/testing/scratchdb"
)

// previousRelease is the release before this one, as CHANGELOG.md's link
// table records it (internal/testing/release): its binaries must keep working on
// the schema the current `idemctl migrate` leaves, since an upgrade
// migrates first and rolls the Deployments after, and a rollback redeploys
// them on the newer schema. Cutting a release records it there, and this
// test then builds it.
func previousRelease(t *testing.T) release.Release {
	t.Helper()
	text, err := release.ReadChangelog(".")
	if err != nil {
		t.Fatal(err)
	}
	r, err := release.Latest(text)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// TestPreviousReleaseOnCurrentSchema migrates a database with the current
// idemctl (then with the previous one, as a rollback's migrate Job does),
// then runs the previous release's enqueuer and completer against
// it under Rocket Rides traffic (riders who give up mid-request, so the
// completer replays), and checks with SQL that every committed staged job
// became exactly one River job.
func TestPreviousReleaseOnCurrentSchema(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	dir := t.TempDir()
	e := &env{t: t, dir: dir}

	prev := previousRelease(t)
	t.Logf("previous release: %s at %s", prev.Version, prev.Commit)
	old := buildRelease(ctx, t, prev.Commit, filepath.Join(dir, "previous"))
	var err error
	if e.bins, err = system.Build(ctx, filepath.Join(dir, "bin")); err != nil {
		t.Fatal(err)
	}

	dbURL, drop, err := scratchdb.Create(ctx, dbtest.ServerURL(t), "idemd_upgrade")
	if err != nil {
		t.Fatal(err)
	}
	e.dbURL = dbURL
	t.Cleanup(func() { _ = drop(context.Background()) })
	if err := dbtest.ApplyRoles(ctx, dbURL); err != nil {
		t.Fatal(err)
	}
	if err := system.Migrate(ctx, e.bins, dbtest.MigratorURL(dbURL)); err != nil {
		t.Fatal(err)
	}
	// A rollback applies the previous manifests, whose migrate Job runs
	// the previous idemctl: on the newer schema it must succeed and
	// change nothing.
	if err := system.Migrate(ctx, old, dbtest.MigratorURL(dbURL)); err != nil {
		t.Fatalf("the previous idemctl migrate on the current schema: %v", err)
	}
	// deploy/sql/roles.sql again after migrate, as an upgrade does: the
	// grants name the tables a migration added.
	if err := dbtest.ApplyRoles(ctx, dbURL); err != nil {
		t.Fatal(err)
	}
	if e.pool, err = pgxpool.New(ctx, dbURL); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.pool.Close)

	secretPath, _ := e.startAPI(ctx)

	// The previous release's daemons, with the flags the suite gives the
	// current ones.
	if e.daemons, err = system.NewDaemons(&system.Binaries{Enqueuer: old.Enqueuer, Completer: old.Completer}, system.DaemonOptions{
		DatabaseURL: dbtest.RuntimeURL(dbURL), APIURL: e.rr.APIURL, SecretFile: secretPath,
		Enqueuers: 1, Completers: 1, Dir: dir, PreviousRelease: true,
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.daemons.Close)
	if err := e.daemons.Start(); err != nil {
		t.Fatal(err)
	}
	wctx, wcancel := context.WithTimeout(ctx, time.Minute)
	defer wcancel()
	for _, p := range e.daemons.All() {
		if err := system.Poll(wctx, 50*time.Millisecond, func() (bool, error) {
			if !p.Running() {
				return false, fmt.Errorf("%s exited", p.Name)
			}
			ok, _ := p.Ready(wctx)
			return ok, nil
		}); err != nil {
			t.Fatalf("previous %s never became ready on the current schema: %v\n%s", p.Name, err, p.LogTail(3000))
		}
		// The previous binary indeed: this release added idemd_build_info.
		metrics, err := p.Metrics(wctx)
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(string(metrics), "idemd_build_info") {
			t.Fatalf("%s exports idemd_build_info: not the previous release's binary", p.Name)
		}
	}

	riders, err := system.Riders(ctx, e.pool, 6, 1)
	if err != nil {
		t.Fatal(err)
	}
	simClient := &http.Client{Timeout: 30 * time.Second}
	defer simClient.CloseIdleConnections()
	defer system.CloseIdleConnections()
	stats, err := simulator.Run(ctx, simulator.Config{
		BaseURL: e.rr.APIURL, APIKeys: riders, Concurrency: 4, Duration: 15 * time.Second,
		GiveUpRate: 0.2, GiveUpAfter: 60 * time.Millisecond, MaxRetries: 2, HTTPClient: simClient,
	})
	if err != nil {
		t.Fatalf("simulator: %v", err)
	}
	e.logf("traffic done: %s", stats)
	if stats.Created == 0 || stats.GaveUp == 0 {
		t.Errorf("traffic did not exercise the system: %s", stats)
	}
	e.settle(ctx)

	stopDaemons(t, e.daemons, "previous release's")

	// The oracle: the staged log (filled by a trigger in the API's own
	// transactions) against River's table.
	var committed, jobs, wrong, stray, dead, left int
	if err := e.pool.QueryRow(ctx, `SELECT
		(SELECT count(*) FROM e2e_staged_log),
		(SELECT count(*) FROM river_job),
		(SELECT count(*) FROM (SELECT l.id FROM e2e_staged_log l
			LEFT JOIN river_job j ON (j.metadata->>'idemd_staged_id')::bigint = l.id
			GROUP BY l.id HAVING count(j.id) <> 1) x),
		(SELECT count(*) FROM river_job j WHERE NOT EXISTS
			(SELECT 1 FROM e2e_staged_log l WHERE l.id = (j.metadata->>'idemd_staged_id')::bigint)),
		(SELECT count(*) FROM staged_jobs_dead),
		(SELECT count(*) FROM staged_jobs)`).Scan(&committed, &jobs, &wrong, &stray, &dead, &left); err != nil {
		t.Fatal(err)
	}
	e.logf("oracle: %d staged rows committed, %d River jobs", committed, jobs)
	if committed == 0 {
		t.Error("no ride staged a receipt job")
	}
	if wrong != 0 || stray != 0 || dead != 0 || left != 0 {
		t.Errorf("committed staged rows without exactly one River job: %d; River jobs no committed row asked for: %d; dead letters: %d; rows left staged: %d",
			wrong, stray, dead, left)
	}
	if t.Failed() {
		for _, p := range append(e.daemons.All(), e.rr.Proc) {
			t.Logf("---- tail of %s\n%s", p.Name, p.LogTail(3000))
		}
	}
}

// buildRelease builds the daemons and idemctl of commit into dir (its source
// stays in dir/src), from
// a copy of the commit's tree (git archive: the repository is only read).
// A checkout without the commit (a shallow clone) skips the test, and
// fails it with CI=true, where the clone must have the history.
func buildRelease(ctx context.Context, t *testing.T, commit, dir string) *system.Binaries {
	t.Helper()
	root, err := system.ModuleRoot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if out, err := exec.CommandContext(ctx, "git", "-C", root, "cat-file", "-e", commit+"^{commit}").CombinedOutput(); err != nil {
		msg := fmt.Sprintf("commit %s (the previous release) is not in this clone (%v %s): fetch the full history (git fetch --unshallow)", commit, err, strings.TrimSpace(string(out)))
		if os.Getenv("CI") == "true" {
			t.Fatal(msg + "; CI=true: the upgrade test must run")
		}
		t.Skip(msg)
	}
	src := filepath.Join(dir, "src")
	if err := os.MkdirAll(src, 0o755); err != nil {
		t.Fatal(err)
	}
	archive := exec.CommandContext(ctx, "sh", "-c", `git -C "$1" archive "$2" | tar -x -C "$3"`, "sh", root, commit, src)
	if out, err := archive.CombinedOutput(); err != nil {
		t.Fatalf("git archive %s: %v\n%s", commit, err, out)
	}
	build := exec.CommandContext(ctx, "go", "build", "-o", dir+string(filepath.Separator), "./cmd/enqueuer", "./cmd/completer", "./cmd/reaper", "./cmd/idemctl")
	build.Dir = src
	// The release's own go.mod and go.sum; modules come from the cache or
	// the configured proxy.
	build.Env = append(os.Environ(), "GOFLAGS="+strings.TrimSpace(os.Getenv("GOFLAGS")+" -mod=mod"), "CGO_ENABLED=0")
	start := time.Now()
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build of %s: %v\n%s", commit, err, out)
	}
	t.Logf("built %s's enqueuer, completer, reaper and idemctl in %s", commit, time.Since(start).Round(time.Second))
	return &system.Binaries{
		Enqueuer: filepath.Join(dir, "enqueuer"), Completer: filepath.Join(dir, "completer"),
		Reaper: filepath.Join(dir, "reaper"), Idemctl: filepath.Join(dir, "idemctl"),
	}
}
