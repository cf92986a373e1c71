// Package load is the end-to-end load run: sustained Rocket Rides traffic
// against the real API process, once without idemd's daemons and once with
// two enqueuers, two completers and the reaper running, reporting the API's
// throughput and latency percentiles for both. The benchmark report
// (internal/benchreport, suite "e2e") and TestLoad in internal/e2e call it.
package load

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"idemd/examples/rocketrides/simulator"
	"idemd/internal/dbtest"
	"idemd/internal/e2e/system"
	"idemd/internal/scratchdb"
)

// LoadOptions tunes a run; zero values take the defaults.
type LoadOptions struct {
	// Duration of each phase (default 60 s).
	Duration time.Duration
	// Concurrency is the number of closed-loop clients (default 8).
	Concurrency int
	// GiveUpRate is the share of requests whose client walks away
	// mid-request (default 0.05), so the completers have real work.
	GiveUpRate float64
	// Riders to spread traffic over (default 20).
	Riders int
	Logf   func(string, ...any)
}

// Phase is one measured phase.
type Phase struct {
	Name     string
	Duration time.Duration
	// Answered requests (any HTTP status) and their rate.
	Requests   int
	Throughput float64 // answered requests per second
	Status     map[int]int
	GaveUp     int // requests the clients abandoned (not in the latencies)
	Errors     int // transport errors other than giving up
	P50, P99   time.Duration
	Max        time.Duration
	// After the phase: River jobs created (the enqueuers' work) and keys
	// neither finished nor flagged (the completers' backlog).
	RiverJobs, OpenKeys int
}

// LoadReport is the result of Load.
type LoadReport struct {
	Concurrency int
	Without     Phase // the API alone
	With        Phase // the API with 2 enqueuers, 2 completers and the reaper
}

// P99Ratio is the p99 with the daemons over the p99 without.
func (r *LoadReport) P99Ratio() float64 {
	return float64(r.With.P99) / float64(max(r.Without.P99, time.Microsecond))
}

// ThroughputRatio is the throughput with the daemons over without.
func (r *LoadReport) ThroughputRatio() float64 {
	if r.Without.Throughput == 0 {
		return 0
	}
	return r.With.Throughput / r.Without.Throughput
}

func (o *LoadOptions) defaults() {
	if o.Duration <= 0 {
		o.Duration = time.Minute
	}
	if o.Concurrency <= 0 {
		o.Concurrency = 8
	}
	if o.GiveUpRate == 0 {
		o.GiveUpRate = 0.05
	}
	if o.Riders <= 0 {
		o.Riders = 20
	}
	if o.Logf == nil {
		o.Logf = func(string, ...any) {}
	}
}

// Load builds the binaries and runs both phases, each in a fresh database
// on the server of adminURL (dropped afterwards), so neither phase inherits
// the other's table sizes.
func Load(ctx context.Context, adminURL string, opts LoadOptions) (*LoadReport, error) {
	opts.defaults()
	dir, err := os.MkdirTemp("", "idemd-load-")
	if err != nil {
		return nil, fmt.Errorf("load: %w", err)
	}
	defer os.RemoveAll(dir)
	bins, err := system.Build(ctx, filepath.Join(dir, "bin"))
	if err != nil {
		return nil, fmt.Errorf("load: %w", err)
	}
	defer system.CloseIdleConnections()
	rep := &LoadReport{Concurrency: opts.Concurrency}
	if rep.Without, err = phase(ctx, adminURL, bins, dir, "API alone", false, opts); err != nil {
		return nil, err
	}
	if rep.With, err = phase(ctx, adminURL, bins, dir, "API with 2 enqueuers, 2 completers, reaper", true, opts); err != nil {
		return nil, err
	}
	return rep, nil
}

func phase(ctx context.Context, adminURL string, bins *system.Binaries, parent, name string, daemons bool, opts LoadOptions) (ph Phase, err error) {
	ph.Name = name
	dir, err := os.MkdirTemp(parent, "phase-")
	if err != nil {
		return ph, fmt.Errorf("load: %w", err)
	}
	dbURL, drop, err := scratchdb.Create(ctx, adminURL, "idemd_load")
	if err != nil {
		return ph, fmt.Errorf("load: %w", err)
	}
	defer func() {
		if derr := drop(context.WithoutCancel(ctx)); derr != nil && err == nil {
			err = fmt.Errorf("load: %w", derr)
		}
	}()
	// deploy/sql/roles.sql as the operator applies it; the migration as
	// idemd_migrator and the daemons as idemd_runtime, as deployed. The API
	// and the measurement keep the admin URL (the API's role is the
	// operator's).
	if err := dbtest.ApplyRoles(ctx, dbURL); err != nil {
		return ph, fmt.Errorf("load: %w", err)
	}
	if err := system.Migrate(ctx, bins, dbtest.MigratorURL(dbURL)); err != nil {
		return ph, fmt.Errorf("load: %w", err)
	}
	secretPath, _, err := system.WriteSecret(dir, "replay-secret")
	if err != nil {
		return ph, fmt.Errorf("load: %w", err)
	}
	rr, err := system.StartRocketRides(ctx, bins, system.RocketRidesOptions{DatabaseURL: dbURL, SecretFile: secretPath, Dir: dir})
	if err != nil {
		return ph, fmt.Errorf("load: %w", err)
	}
	defer rr.Close()
	pool, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		return ph, fmt.Errorf("load: pool: %w", err)
	}
	defer pool.Close()
	riders, err := system.Riders(ctx, pool, opts.Riders, 1)
	if err != nil {
		return ph, fmt.Errorf("load: %w", err)
	}
	if daemons {
		ds, err := system.NewDaemons(bins, system.DaemonOptions{
			DatabaseURL: dbtest.RuntimeURL(dbURL), APIURL: rr.APIURL, SecretFile: secretPath, Enqueuers: 2, Completers: 2, Reaper: true, Dir: dir,
		})
		if err != nil {
			return ph, fmt.Errorf("load: %w", err)
		}
		defer ds.Close()
		if err := ds.Start(); err != nil {
			return ph, fmt.Errorf("load: %w", err)
		}
		wctx, cancel := context.WithTimeout(ctx, time.Minute)
		defer cancel()
		for _, p := range ds.All() {
			if err := system.Poll(wctx, 50*time.Millisecond, func() (bool, error) { ok, _ := p.Ready(wctx); return ok, nil }); err != nil {
				return ph, fmt.Errorf("load: %s not ready: %w", p.Name, err)
			}
		}
	}
	opts.Logf("load: %s for %s, %d clients", name, opts.Duration, opts.Concurrency)
	drive(ctx, rr.APIURL, riders, opts, &ph)
	if err := pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM river_job),
		(SELECT count(*) FROM idempotency_keys k WHERE recovery_point <> 'finished'
		 AND NOT EXISTS (SELECT 1 FROM idempotency_key_reviews r WHERE r.key_id = k.id))`).Scan(&ph.RiverJobs, &ph.OpenKeys); err != nil {
		return ph, fmt.Errorf("load: counts: %w", err)
	}
	opts.Logf("load: %s: %.0f req/s, p50 %s, p99 %s, statuses %v, gave up %d, River jobs %d, open keys %d",
		name, ph.Throughput, ph.P50, ph.P99, ph.Status, ph.GaveUp, ph.RiverJobs, ph.OpenKeys)
	if ph.Requests == 0 {
		return ph, errors.New("load: no request was answered")
	}
	return ph, nil
}

// drive runs closed-loop clients for opts.Duration: each sends a ride with
// a fresh key as soon as its previous one is answered.
func drive(ctx context.Context, apiURL string, riders []string, opts LoadOptions, ph *Phase) {
	client := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: opts.Concurrency}}
	defer client.CloseIdleConnections()
	runCtx, cancel := context.WithTimeout(ctx, opts.Duration)
	defer cancel()
	var (
		mu        sync.Mutex
		latencies []time.Duration
		wg        sync.WaitGroup
	)
	ph.Status = map[int]int{}
	start := time.Now()
	for range opts.Concurrency {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for runCtx.Err() == nil {
				giveUp := rand.Float64() < opts.GiveUpRate
				reqCtx, rcancel := context.WithCancel(runCtx)
				if giveUp {
					t := time.AfterFunc(time.Duration(rand.IntN(20_000))*time.Microsecond, rcancel)
					defer t.Stop()
				}
				t0 := time.Now()
				status, err := post(reqCtx, client, apiURL, riders[rand.IntN(len(riders))])
				d := time.Since(t0)
				rcancel()
				mu.Lock()
				switch {
				case err != nil && giveUp:
					ph.GaveUp++
				case err != nil && runCtx.Err() != nil:
					// Cut off by the end of the phase: not a measurement.
				case err != nil:
					ph.Errors++
				default:
					ph.Status[status]++
					latencies = append(latencies, d)
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	ph.Duration = time.Since(start)
	ph.Requests = len(latencies)
	ph.Throughput = float64(len(latencies)) / ph.Duration.Seconds()
	slices.Sort(latencies)
	ph.P50, ph.P99 = percentile(latencies, 0.50), percentile(latencies, 0.99)
	if n := len(latencies); n > 0 {
		ph.Max = latencies[n-1]
	}
}

func percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(float64(len(sorted)-1) * p)
	return sorted[i]
}

func post(ctx context.Context, client *http.Client, apiURL, apiKey string) (int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, apiURL+"/rides", strings.NewReader(simulator.RandomParams().Encode()))
	if err != nil {
		return 0, err
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Authorization", "Bearer "+apiKey)
	req.Header.Set("Idempotency-Key", uuid.NewString())
	resp, err := client.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode, nil
}
