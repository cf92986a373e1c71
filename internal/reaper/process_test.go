package reaper

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemd/idemd/internal/lease"
	"github.com/idemd/idemd/internal/runhistory"
	"github.com/idemd/idemd/internal/testing/dbtest"
	"github.com/idemd/idemd/internal/testing/testbin"
	"github.com/idemd/idemd/internal/testing/testwait"
)

type proc struct {
	cmd            *exec.Cmd
	stdout, stderr *bytes.Buffer
	done           chan struct{}
	err            error
}

func startReaper(t *testing.T, bin, dbURL string, args ...string) *proc {
	t.Helper()
	p := &proc{stdout: &bytes.Buffer{}, stderr: &bytes.Buffer{}, done: make(chan struct{})}
	p.cmd = exec.Command(bin, append([]string{"--http-addr", "", "--batch-pause", "0s"}, args...)...)
	p.cmd.Env = append(os.Environ(), "DATABASE_URL="+dbURL)
	p.cmd.Stdout, p.cmd.Stderr = p.stdout, p.stderr
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.err = p.cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		select {
		case <-p.done:
		default:
			_ = p.cmd.Process.Kill()
			<-p.done
		}
	})
	return p
}

// wait returns the exit code, failing the test after a generous deadline.
func (p *proc) wait(t *testing.T) int {
	t.Helper()
	select {
	case <-p.done:
	case <-time.After(2 * time.Minute):
		t.Fatalf("reaper did not exit; stderr:\n%s", p.stderr)
	}
	var ee *exec.ExitError
	if errors.As(p.err, &ee) {
		return ee.ExitCode()
	}
	if p.err != nil {
		t.Fatal(p.err)
	}
	return 0
}

// newProcessTest builds the reaper binary (once per test binary) and
// creates a fresh database: its URL for the process, a pool for the test's
// own checks.
func newProcessTest(t *testing.T) (bin, dbURL string, pool *pgxpool.Pool) {
	t.Helper()
	bin = testbin.Build(t, "github.com/idemd/idemd/cmd/reaper")
	dbURL = dbtest.NewDatabase(t)
	pool, err := pgxpool.New(context.Background(), dbURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return bin, dbURL, pool
}

// runReaper runs a reaper to its exit and fails the test unless it exits
// with want.
func runReaper(t *testing.T, bin, dbURL string, want int, args ...string) *proc {
	t.Helper()
	p := startReaper(t, bin, dbURL, args...)
	if code := p.wait(t); code != want {
		t.Fatalf("reaper %v: exit %d, want %d; stderr:\n%s", args, code, want, p.stderr)
	}
	return p
}

// reaperWaitingOnLock reports whether a reaper session of this database is
// blocked on a row lock (the test's).
func reaperWaitingOnLock(t *testing.T, pool *pgxpool.Pool) bool {
	return queryInt(t, pool, `SELECT count(*) FROM pg_stat_activity
WHERE datname = current_database() AND application_name = 'idemd-reaper' AND wait_event_type = 'Lock'`) > 0
}

// leaseHeld reports whether a reaper lease row exists (held or left to
// expire).
func leaseHeld(t *testing.T, pool *pgxpool.Pool) bool {
	return queryInt(t, pool, "SELECT count(*) FROM idemd_leases WHERE name = $1", LeaseName) > 0
}

// noAdvisoryLocks fails the test if any session of this database holds an
// advisory lock: idemd takes none that could outlive a transaction.
func noAdvisoryLocks(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	n, err := dbtest.AdvisoryLocks(context.Background(), pool)
	if err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Fatalf("%d advisory locks held", n)
	}
}

// killInSecondBatch inserts 30 keys past retention (every third
// unfinished) with a ride on the 16th, starts a reaper with args (batch size
// 10) and SIGKILLs it while its second batch waits on that ride's row lock.
// It returns once the batch was rolled back: the server notices the dead
// client (client_connection_check_interval, set in the batch; behind
// pgbouncer, which closes the server connection of a client that vanished
// mid-transaction) and ends the session even while the test holds the row
// lock, which is then released. The killed run's lease stays behind.
func killInSecondBatch(t *testing.T, bin, dbURL string, pool *pgxpool.Pool, args ...string) []int64 {
	t.Helper()
	ids := insertOldKeys(t, pool, 30)
	createRides(t, pool, "SET NULL", ids[15])
	release := blockOnRide(t, pool, ids[15])
	p := startReaper(t, bin, dbURL, args...)
	testwait.Until(t, time.Minute, "the reaper to block in its second batch", func() bool { return reaperWaitingOnLock(t, pool) })
	if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-p.done
	testwait.Until(t, time.Minute, "the killed reaper's batch to be rolled back", func() bool { return !reaperWaitingOnLock(t, pool) })
	release()
	return ids
}

// blockOnRide opens a transaction holding the row lock of the ride that
// references key, so a reaper deleting that key (ON DELETE SET NULL) waits
// inside its batch. The returned func releases it.
func blockOnRide(t *testing.T, pool *pgxpool.Pool, key int64) func() {
	t.Helper()
	ctx := context.Background()
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	released := false
	release := func() {
		if !released {
			released = true
			_ = tx.Rollback(ctx)
		}
	}
	// Registered before anything can fail: an open transaction would keep
	// its connection, and the pool's Close would wait for it forever.
	t.Cleanup(release)
	if _, err := tx.Exec(ctx, "SELECT * FROM rides WHERE idempotency_key_id = $1 FOR UPDATE", key); err != nil {
		t.Fatal(err)
	}
	return release
}

func TestProcessConcurrentRunsNeverOverlap(t *testing.T) {
	bin, dbURL, pool := newProcessTest(t)
	ids := insertOldKeys(t, pool, 30)
	createRides(t, pool, "SET NULL", ids[15])
	release := blockOnRide(t, pool, ids[15])

	// The first process deletes one batch, then waits inside the second.
	first := startReaper(t, bin, dbURL, "--batch-size", "10")
	testwait.Until(t, time.Minute, "the first reaper to block in its second batch", func() bool { return reaperWaitingOnLock(t, pool) })
	if n := queryInt(t, pool, "SELECT count(*) FROM idempotency_keys"); n != 20 {
		t.Fatalf("%d keys left while the first run is mid-way, want 20", n)
	}

	second := runReaper(t, bin, dbURL, 0, "--batch-size", "10")
	if !strings.Contains(second.stderr.String(), "another reaper run holds the lease") {
		t.Fatalf("second process did not say the lock was held:\n%s", second.stderr)
	}
	if n := queryInt(t, pool, "SELECT count(*) FROM idempotency_keys"); n != 20 {
		t.Fatalf("the second process deleted keys: %d left", n)
	}

	release()
	if code := first.wait(t); code != 0 {
		t.Fatalf("first process exit %d; stderr:\n%s", code, first.stderr)
	}
	if n := queryInt(t, pool, "SELECT count(*) FROM idempotency_keys"); n != 0 {
		t.Fatalf("%d keys left", n)
	}
	if n := queryInt(t, pool, "SELECT count(*) FROM idempotency_key_reviews"); n != 10 {
		t.Fatalf("%d reviews, want 10", n)
	}
	// The summary line is one JSON object with the counts.
	if !strings.Contains(first.stderr.String(), `"msg":"reaper run summary"`) || !strings.Contains(first.stderr.String(), `"deleted":30`) {
		t.Fatalf("no JSON summary in:\n%s", first.stderr)
	}
}

// TestProcessLockHeldExternally: a manual run while another live run holds
// the lease (here the test, renewing it) exits 0, does nothing, and names
// the holder.
func TestProcessLockHeldExternally(t *testing.T) {
	bin, dbURL, pool := newProcessTest(t)
	insertOldKeys(t, pool, 5)
	ctx := context.Background()
	if a, err := lease.Acquire(ctx, pool, LeaseName, "test-holder", time.Hour); err != nil || !a.Acquired {
		t.Fatalf("acquire: %+v, %v", a, err)
	}
	// A live holder renews its lease; the run must see that to give up.
	renewCtx, stopRenewing := context.WithCancel(ctx)
	renewed := make(chan struct{})
	go func() {
		defer close(renewed)
		for renewCtx.Err() == nil {
			if err := lease.Renew(renewCtx, pool, LeaseName, "test-holder", time.Hour); err != nil && renewCtx.Err() == nil {
				t.Errorf("renew: %v", err)
				return
			}
			select {
			case <-renewCtx.Done():
			case <-time.After(100 * time.Millisecond):
			}
		}
	}()
	defer func() { stopRenewing(); <-renewed }()
	p := startReaper(t, bin, dbURL)
	code := p.wait(t)
	if code != 0 || queryInt(t, pool, "SELECT count(*) FROM idempotency_keys") != 5 {
		t.Fatalf("exit %d; stderr:\n%s", code, p.stderr)
	}
	if !strings.Contains(p.stderr.String(), `"result":"lock_held"`) || !strings.Contains(p.stderr.String(), `"lease_holder":"test-holder"`) {
		t.Fatalf("the summary does not say who holds the lease:\n%s", p.stderr)
	}
}

// TestProcessSIGKILLMidRun kills a reaper inside its second batch: the first
// batch stays done (with its reviews), the second leaves no trace, the lock
// is released, and the next run finishes the job.
func TestProcessSIGKILLMidRun(t *testing.T) {
	bin, dbURL, pool := newProcessTest(t)
	leaseArgs := []string{"--lease-ttl", "6s", "--statement-timeout", "5s"}
	ids := killInSecondBatch(t, bin, dbURL, pool, append([]string{"--batch-size", "10"}, leaseArgs...)...)
	if !leaseHeld(t, pool) {
		t.Fatal("the killed run's lease is gone: the next run would not have to take it over")
	}
	noAdvisoryLocks(t, pool)
	// The run history: the killed run has no end and the counts of its
	// committed batch; it reads as interrupted once its lease expires.
	killed := lastRun(t, pool)
	if killed.FinishedAt != nil || killed.Deleted != 10 || killed.Mode != runhistory.ModeOnce {
		t.Fatalf("the killed run is recorded as %+v", killed)
	}
	testwait.Until(t, time.Minute, "the killed run to read as interrupted", func() bool {
		return lastRun(t, pool).Result == runhistory.ResultInterrupted
	})

	consistent := func(wantKeys int64) {
		t.Helper()
		if n := queryInt(t, pool, "SELECT count(*) FROM idempotency_keys"); n != wantKeys {
			t.Fatalf("%d keys, want %d", n, wantKeys)
		}
		// Every deleted unfinished key has exactly one review; no present
		// key has one.
		if n := queryInt(t, pool, `SELECT count(*) FROM idempotency_key_reviews r
WHERE EXISTS (SELECT 1 FROM idempotency_keys k WHERE k.id = r.key_id)`); n != 0 {
			t.Fatalf("%d reviews of keys that were not deleted", n)
		}
		deletedUnfinished := int64(0)
		for i, id := range ids {
			if (i+1)%3 == 0 && !keyExists(t, pool, id) {
				deletedUnfinished++
				if got := reviewReasons(t, pool, id); len(got) != 1 {
					t.Fatalf("deleted unfinished key %d has reviews %v", id, got)
				}
			}
		}
		if n := queryInt(t, pool, "SELECT count(*) FROM idempotency_key_reviews"); n != deletedUnfinished {
			t.Fatalf("%d reviews, %d deleted unfinished keys", n, deletedUnfinished)
		}
	}
	consistent(20)

	// The next run waits for the dead run's lease to expire, takes it over
	// and finishes the job: a killed run never turns into runs that do
	// nothing.
	next := runReaper(t, bin, dbURL, 0, append([]string{"--batch-size", "10"}, leaseArgs...)...)
	consistent(0)
	if !strings.Contains(next.stderr.String(), "took over the lease") || !strings.Contains(next.stderr.String(), `"took_over_from":"reaper/`) {
		t.Fatalf("the next run does not say it took over the lease:\n%s", next.stderr)
	}
	if leaseHeld(t, pool) {
		t.Fatal("the run did not release its lease")
	}
	runs, err := runhistory.LastRuns(context.Background(), pool, 5)
	if err != nil {
		t.Fatal(err)
	}
	if len(runs) != 2 || runs[0].Result != runhistory.ResultComplete || runs[0].Deleted != 20 ||
		runs[1].ID != killed.ID || runs[1].Result != runhistory.ResultInterrupted || runs[1].Deleted != 10 || runs[1].FinishedAt != nil {
		t.Fatalf("run history %+v; want the next run complete with 20 keys, then the killed one interrupted with 10", runs)
	}
	if n := queryInt(t, pool, "SELECT count(*) FROM rides WHERE idempotency_key_id IS NULL"); n != 1 {
		t.Fatal("the ride did not lose its reference")
	}
}

// TestProcessSIGTERMMidBatch: SIGTERM to a one-shot run cancels the batch
// in progress, which rolls back whole (no key of it deleted, no review of
// it kept); the run ends incomplete, exits 0, releases its lease and
// records its end, and the next run finishes the job.
func TestProcessSIGTERMMidBatch(t *testing.T) {
	bin, dbURL, pool := newProcessTest(t)
	ids := insertOldKeys(t, pool, 30)
	createRides(t, pool, "SET NULL", ids[15])
	release := blockOnRide(t, pool, ids[15])
	p := startReaper(t, bin, dbURL, "--batch-size", "10")
	testwait.Until(t, time.Minute, "the reaper to block in its second batch", func() bool { return reaperWaitingOnLock(t, pool) })
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code := p.wait(t); code != 0 {
		t.Fatalf("exit %d after SIGTERM, want 0; stderr:\n%s", code, p.stderr)
	}
	release()
	if !strings.Contains(p.stderr.String(), `"result":"incomplete"`) || !strings.Contains(p.stderr.String(), `"stop_reason":"shutdown"`) {
		t.Fatalf("the summary does not say the run was stopped:\n%s", p.stderr)
	}
	if n := queryInt(t, pool, "SELECT count(*) FROM idempotency_keys"); n != 20 {
		t.Fatalf("%d keys left, want 20: the first batch kept, the second rolled back", n)
	}
	if n := queryInt(t, pool, "SELECT count(*) FROM idempotency_key_reviews"); n != 3 {
		t.Fatalf("%d reviews, want the first batch's 3", n)
	}
	if leaseHeld(t, pool) {
		t.Fatal("the stopped run did not release its lease")
	}
	if r := lastRun(t, pool); r.Result != runhistory.ResultIncomplete || r.Deleted != 10 || r.Flagged != 3 || r.FinishedAt == nil {
		t.Fatalf("the stopped run is recorded as %+v", r)
	}
	next := runReaper(t, bin, dbURL, 0, "--batch-size", "10")
	if !strings.Contains(next.stderr.String(), `"deleted":20`) || queryInt(t, pool, "SELECT count(*) FROM idempotency_keys") != 0 {
		t.Fatalf("the next run did not finish the job:\n%s", next.stderr)
	}
}

func TestProcessRestrictExits1NamingTheConstraint(t *testing.T) {
	bin, dbURL, pool := newProcessTest(t)
	ids := insertOldKeys(t, pool, 12)
	createRides(t, pool, "RESTRICT", ids[7])
	p := runReaper(t, bin, dbURL, 1, "--batch-size", "5")
	if !strings.Contains(p.stderr.String(), `rides_idempotency_key_id_fkey`) {
		t.Fatalf("stderr does not name the constraint:\n%s", p.stderr)
	}
	if n := queryInt(t, pool, "SELECT count(*) FROM idempotency_keys"); n != 7 {
		t.Fatalf("%d keys left, want 7 (the first batch kept)", n)
	}
}

func TestProcessBadFlagsExit2ListingEveryProblem(t *testing.T) {
	bin := testbin.Build(t, "github.com/idemd/idemd/cmd/reaper")
	cmd := exec.Command(bin, "--retention", "10m", "--batch-size", "0", "--schedule", "every hour",
		"--max-runtime", "soon", "--statement-timeout", "0s", "--max-deletes", "-5", "--wal-compression", "gzip", "--lease-ttl", "0s")
	cmd.Env = append(os.Environ(), "DATABASE_URL=", "IDEMD_LOCK_WINDOW=-1s")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	err := cmd.Run()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 2 {
		t.Fatalf("exit %v, want 2; stderr:\n%s", err, stderr.String())
	}
	for _, want := range []string{"--database-url", "--retention", "--batch-size", "--schedule", "--max-runtime", "--statement-timeout", "--max-deletes", "--lock-window", "--wal-compression", "--lease-ttl"} {
		if !strings.Contains(stderr.String(), want) {
			t.Errorf("stderr lacks %q:\n%s", want, stderr.String())
		}
	}
}

func TestProcessDryRunPrints(t *testing.T) {
	bin, dbURL, pool := newProcessTest(t)
	insertOldKeys(t, pool, 6)
	before := tableDigest(t, pool)
	p := runReaper(t, bin, dbURL, 0, "--dry-run")
	if !strings.Contains(p.stdout.String(), "would delete 6 keys") || !strings.Contains(p.stdout.String(), "would flag 2 keys") {
		t.Fatalf("stdout:\n%s", p.stdout)
	}
	if tableDigest(t, pool) != before {
		t.Fatal("dry run changed the tables")
	}
}

// TestProcessSIGKILLMidConcurrentRun: a reaper with --concurrency 3 whose
// first round meets a blocked ride in its second range commits the other
// two batches of the round, redoes the second alone, and is SIGKILLed
// while that batch waits on the ride: the two committed batches stay (with
// their reviews), the killed one leaves no trace, and the next run takes
// the lease over and finishes, by the tables' own counts.
func TestProcessSIGKILLMidConcurrentRun(t *testing.T) {
	bin, dbURL, pool := newProcessTest(t)
	ids := insertOldKeys(t, pool, 60) // every third unfinished
	createRides(t, pool, "SET NULL", ids[15])
	release := blockOnRide(t, pool, ids[15])
	args := []string{"--batch-size", "10", "--concurrency", "3", "--lease-ttl", "6s", "--statement-timeout", "5s"}
	p := startReaper(t, bin, dbURL, args...)
	// The batch redone alone skips locked keys and waits on the ride
	// without a lock timeout; the round's own attempt gave up after 50 ms.
	redoWaiting := func() bool {
		return queryInt(t, pool, `SELECT count(*) FROM pg_stat_activity
WHERE datname = current_database() AND application_name = 'idemd-reaper' AND wait_event_type = 'Lock'
  AND query LIKE '%SKIP LOCKED%'`) > 0
	}
	testwait.Until(t, time.Minute, "the redone batch to wait on the ride", redoWaiting)
	if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-p.done
	testwait.Until(t, time.Minute, "the killed reaper's batch to be rolled back", func() bool { return !reaperWaitingOnLock(t, pool) })
	release()

	var left []int64
	for i, id := range ids {
		if keyExists(t, pool, id) {
			left = append(left, int64(i))
		}
	}
	// The round was [0,10), [10,20), [20,30): the first and third stay
	// deleted, the second (redone alone when killed) is whole.
	if len(left) != 40 || left[0] != 10 || left[9] != 19 || left[10] != 30 {
		t.Fatalf("keys left by index: %v; want 10-19 and 30-59", left)
	}
	if n := queryInt(t, pool, `SELECT count(*) FROM idempotency_key_reviews r
WHERE EXISTS (SELECT 1 FROM idempotency_keys k WHERE k.id = r.key_id)`); n != 0 {
		t.Fatalf("%d reviews of keys that were not deleted", n)
	}
	// Index i is unfinished when (i+1)%3 == 0: 3 in [0,10), 4 in [20,30).
	if n := queryInt(t, pool, "SELECT count(*) FROM idempotency_key_reviews"); n != 7 {
		t.Fatalf("%d reviews after the two committed batches, want their 7 unfinished keys", n)
	}
	if killed := lastRun(t, pool); killed.FinishedAt != nil || killed.Deleted != 20 {
		t.Fatalf("the killed run is recorded as %+v", killed)
	}

	next := runReaper(t, bin, dbURL, 0, args...)
	if !strings.Contains(next.stderr.String(), "took over the lease") {
		t.Fatalf("the next run does not say it took over the lease:\n%s", next.stderr)
	}
	if n := queryInt(t, pool, "SELECT count(*) FROM idempotency_keys"); n != 0 {
		t.Fatalf("%d keys left after the next run", n)
	}
	if n := queryInt(t, pool, "SELECT count(*) FROM idempotency_key_reviews"); n != 20 {
		t.Fatalf("%d reviews, want one per unfinished key: 20", n)
	}
	if n := queryInt(t, pool, "SELECT count(*) FROM (SELECT key_id FROM idempotency_key_reviews GROUP BY key_id HAVING count(*) > 1) d"); n != 0 {
		t.Fatalf("%d keys flagged twice", n)
	}
	if n := queryInt(t, pool, "SELECT count(*) FROM rides WHERE idempotency_key_id IS NULL"); n != 1 {
		t.Fatal("the ride did not lose its reference")
	}
}
