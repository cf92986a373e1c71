package enqueuer

import (
	"bytes"
	"context"
	"errors"
	"math/rand/v2"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemd/idemd/internal/testing/dbtest"
	"github.com/idemd/idemd/internal/testing/testbin"
	"github.com/idemd/idemd/internal/testing/testwait"
)

// The built binary is SIGKILLed at random points while it drains a large
// backlog, then restarted, a dozen times. After every kill the table and
// River together hold each staged row exactly once; at the end River holds
// exactly one job per staged row.
func TestSIGKILLDuringDrainLosesAndDuplicatesNothing(t *testing.T) {
	dbURL := dbtest.NewDatabase(t)
	poolCtx := context.Background()
	p, err := pgxpool.New(poolCtx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()

	const total = 150_000
	if _, err := p.Exec(poolCtx, `INSERT INTO staged_jobs (job_name, job_args) SELECT 'k', jsonb_build_object('i', g) FROM generate_series(1, $1) g`, total); err != nil {
		t.Fatal(err)
	}
	bin := testbin.Build(t, "github.com/idemd/idemd/cmd/enqueuer")
	rng := rand.New(rand.NewPCG(7, 11))
	kills := 0
	for kills < 12 {
		before := count(t, p, "SELECT count(*) FROM river_job")
		if before == total {
			break
		}
		cmd := exec.Command(bin, "--http-addr=", "--batch-size=1000", "--sweep-interval=100ms", "--log-format=console")
		cmd.Env = append(os.Environ(), "DATABASE_URL="+dbURL)
		var logs bytes.Buffer
		cmd.Stderr = &logs
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		// Kill only once the process is visibly mid-drain, then after a
		// random extra delay so the kill lands anywhere in a batch.
		testwait.Until(t, 2*time.Minute, "progress", func() bool { return count(t, p, "SELECT count(*) FROM river_job") > before })
		time.Sleep(time.Duration(rng.IntN(40)) * time.Millisecond)
		if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		_ = cmd.Wait()
		kills++
		t.Logf("kill %d landed after %d jobs", kills, count(t, p, "SELECT count(*) FROM river_job"))

		// One statement, one snapshot: a COMMIT the killed process sent
		// just before the kill may still land, and three separate counts
		// could straddle it.
		var inRiver, distinct, staged int64
		if err := p.QueryRow(poolCtx, `SELECT (SELECT count(*) FROM river_job),
       (SELECT count(DISTINCT metadata->>'idemd_staged_id') FROM river_job), (SELECT count(*) FROM staged_jobs)`).Scan(&inRiver, &distinct, &staged); err != nil {
			t.Fatal(err)
		}
		if inRiver != distinct || inRiver+staged != total {
			t.Fatalf("after kill %d: %d jobs (%d distinct), %d staged, want sum %d\n%s", kills, inRiver, distinct, staged, total, logs.String())
		}
	}
	if kills < 10 {
		t.Fatalf("only %d kills landed mid-drain; backlog too small", kills)
	}

	// Restart once more and let it finish: --once drains and exits 0.
	cmd := exec.Command(bin, "--http-addr=", "--once", "--log-format=console")
	cmd.Env = append(os.Environ(), "DATABASE_URL="+dbURL)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("--once: %v\n%s", err, out)
	}
	missing := count(t, p, `SELECT count(*) FROM generate_series(1, $1) g
LEFT JOIN (SELECT DISTINCT (args->>'i')::int AS i FROM river_job) r ON r.i = g WHERE r.i IS NULL`, total)
	dups := count(t, p, `SELECT count(*) FROM (SELECT args->>'i' FROM river_job GROUP BY 1 HAVING count(*) > 1) d`)
	if missing != 0 || dups != 0 || count(t, p, "SELECT count(*) FROM river_job") != total {
		t.Fatalf("after %d kills: %d missing, %d duplicated", kills, missing, dups)
	}
}

func TestBadConfigExitsTwoListingEveryProblem(t *testing.T) {
	bin := testbin.Build(t, "github.com/idemd/idemd/cmd/enqueuer")
	cases := []struct {
		name string
		args []string
		env  []string
		want []string
	}{
		{"missing database url", nil, nil, []string{"--database-url (or DATABASE_URL) is required"}},
		{"everything wrong at once", []string{"--sweep-interval=soon", "--batch-size=0", "--stats-interval=-1s", "--max-args-bytes=lots"}, nil,
			[]string{"--sweep-interval", "--batch-size must be between 1 and 100000", "--stats-interval must be positive", "--max-args-bytes", "--database-url"}},
		{"bad env duration", nil, []string{"IDEMD_SWEEP_INTERVAL=never", "DATABASE_URL=postgres://x@127.0.0.1/x"}, []string{"--sweep-interval"}},
		{"unknown flag", []string{"--batchsize=10"}, []string{"DATABASE_URL=postgres://x@127.0.0.1/x"}, []string{"unknown flag --batchsize"}},
		{"bad log format", []string{"--log-format=xml"}, []string{"DATABASE_URL=postgres://x@127.0.0.1/x"}, []string{"--log-format"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cmd := exec.Command(bin, c.args...)
			cmd.Env = append(cleanEnv(), c.env...)
			out, err := cmd.CombinedOutput()
			var exitErr *exec.ExitError
			if !errors.As(err, &exitErr) || exitErr.ExitCode() != 2 {
				t.Fatalf("exit %v, want 2\n%s", err, out)
			}
			for _, w := range c.want {
				if !strings.Contains(string(out), w) {
					t.Errorf("output lacks %q:\n%s", w, out)
				}
			}
		})
	}
}

// cleanEnv drops DATABASE_URL and IDEMD_* so the host's settings don't leak in.
func cleanEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "DATABASE_URL=") || strings.HasPrefix(kv, "IDEMD_") {
			continue
		}
		env = append(env, kv)
	}
	return env
}
