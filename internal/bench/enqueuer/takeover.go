package enqueuerbench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemd/idemd/internal/testing/e2e/alertcheck"
	"github.com/idemd/idemd/internal/testing/e2e/system"
)

// TakeoverBinary is one enqueuer build whose takeover is measured.
type TakeoverBinary struct {
	Name string
	Path string   // "" builds ./cmd/enqueuer from Root
	Args []string // added to both processes' flags
}

// TakeoverOptions size RunTakeover.
type TakeoverOptions struct {
	// Binaries are measured in turn, one round of each after another, so a
	// noisy moment of the machine falls on all of them alike.
	Binaries []TakeoverBinary
	Rounds   int    // default 10
	Root     string // the module root, to build a binary without a Path
	Logf     func(format string, args ...any)
}

// Takeover is one binary's takeovers: from the SIGKILL of the drainer to
// the moment a row staged right after it is in River. With the sweep an
// hour away only the survivor's takeover (its full pass) can move it.
type Takeover struct {
	Name          string
	Samples       []time.Duration
	P50, P90, Max time.Duration
}

// RunTakeover measures, for each binary, Rounds takeovers of a SIGKILLed
// drainer by a standby, on a database of its own.
func RunTakeover(ctx context.Context, adminURL string, opts TakeoverOptions) ([]Takeover, error) {
	if opts.Rounds <= 0 {
		opts.Rounds = 10
	}
	logf := opts.Logf
	if logf == nil {
		logf = func(string, ...any) {}
	}
	dir, err := os.MkdirTemp("", "takeoverbench-")
	if err != nil {
		return nil, fmt.Errorf("takeover: %w", err)
	}
	defer os.RemoveAll(dir) // a temp dir
	type target struct {
		bin   TakeoverBinary
		pool  *pgxpool.Pool
		dbURL string
	}
	var targets []*target
	built := ""
	for _, b := range opts.Binaries {
		if b.Path == "" && built != "" {
			b.Path = built
		}
		if b.Path == "" {
			b.Path = filepath.Join(dir, "enqueuer")
			built = b.Path
			cmd := exec.CommandContext(ctx, "go", "build", "-o", b.Path, "./cmd/enqueuer")
			cmd.Dir = opts.Root
			if out, err := cmd.CombinedOutput(); err != nil {
				return nil, fmt.Errorf("takeover: build the enqueuer: %w\n%s", err, out)
			}
		}
		pool, drop, err := newDatabase(ctx, adminURL)
		if err != nil {
			return nil, err
		}
		defer drop()
		defer pool.Close()
		targets = append(targets, &target{bin: b, pool: pool, dbURL: pool.Config().ConnString()})
	}
	res := make([]Takeover, len(targets))
	for i, tg := range targets {
		res[i].Name = tg.bin.Name
	}
	for round := range opts.Rounds {
		for i, tg := range targets {
			d, err := takeoverOnce(ctx, tg.bin, tg.dbURL, tg.pool, filepath.Join(dir, fmt.Sprintf("%d-%d", i, round)))
			if err != nil {
				return nil, fmt.Errorf("takeover %s, round %d: %w", tg.bin.Name, round, err)
			}
			logf("takeover %s, round %d: %s", tg.bin.Name, round, d)
			res[i].Samples = append(res[i].Samples, d)
		}
	}
	for i := range res {
		s := slices.Clone(res[i].Samples)
		slices.Sort(s)
		res[i].P50, res[i].P90, res[i].Max = s[len(s)/2], s[min(len(s)-1, len(s)*9/10)], s[len(s)-1]
	}
	return res, nil
}

// takeoverOnce starts two enqueuer processes of bin on the database, the
// first the drainer and the second standing by, SIGKILLs the drainer, stages
// one row and returns how long after the kill the row was in River.
func takeoverOnce(ctx context.Context, bin TakeoverBinary, dbURL string, pool *pgxpool.Pool, logPrefix string) (time.Duration, error) {
	start := func(name string) (*system.Proc, error) {
		addr, err := system.FreeAddr()
		if err != nil {
			return nil, err
		}
		p := &system.Proc{Name: name, Bin: bin.Path, OpsAddr: addr, LogPath: logPrefix + "-" + name + ".log",
			Args: append([]string{"--http-addr=" + addr, "--sweep-interval=1h", "--log-format=console"}, bin.Args...),
			Env:  []string{"DATABASE_URL=" + dbURL}}
		return p, p.Start()
	}
	// waitFor polls p's /metrics until series is 1, for a minute.
	waitFor := func(p *system.Proc, series string) error {
		wctx, cancel := context.WithTimeout(ctx, time.Minute)
		defer cancel()
		err := system.Poll(wctx, 10*time.Millisecond, func() (bool, error) {
			page, err := p.Metrics(wctx)
			if err != nil {
				return false, nil // not answering yet
			}
			samples, err := alertcheck.ParseText(bytes.NewReader(page))
			if err != nil {
				return false, err
			}
			for _, s := range samples {
				if s.Name == series && s.Value == 1 {
					return true, nil
				}
			}
			return false, nil
		})
		if err != nil {
			return fmt.Errorf("%s: no %s = 1 within a minute: %w", p.Name, series, err)
		}
		return nil
	}
	a, err := start("a")
	if a != nil {
		defer a.Close()
	}
	if err != nil {
		return 0, err
	}
	if err := waitFor(a, "idemd_enqueuer_listener_up"); err != nil {
		return 0, err
	}
	b, err := start("b")
	if b != nil {
		defer b.Close()
	}
	if err != nil {
		return 0, err
	}
	if err := waitFor(b, "idemd_enqueuer_standby"); err != nil {
		return 0, err
	}
	var before int64
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM river_job").Scan(&before); err != nil {
		return 0, err
	}
	// A drainer dies at any moment of the standby's attempts: the kill
	// lands at a random point of a quarter second, not in step with the
	// standby's start.
	select {
	case <-ctx.Done():
		return 0, ctx.Err()
	case <-time.After(time.Duration(rand.Int64N(int64(250 * time.Millisecond)))):
	}
	killed := time.Now()
	if err := a.Kill(); err != nil {
		return 0, fmt.Errorf("kill the drainer: %w", err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO staged_jobs (job_name, job_args) VALUES ('takeover', '{}')`); err != nil {
		return 0, fmt.Errorf("stage: %w", err)
	}
	deadline := killed.Add(time.Minute)
	for time.Now().Before(deadline) {
		var n int64
		if err := pool.QueryRow(ctx, "SELECT count(*) FROM river_job").Scan(&n); err != nil {
			return 0, err
		}
		if n > before {
			took := time.Since(killed)
			return took, waitFor(b, "idemd_enqueuer_listener_up")
		}
		time.Sleep(time.Millisecond) // a benchmark's poll, not a test's wait
	}
	return 0, errors.New("the row staged after the kill was not in River within a minute")
}
