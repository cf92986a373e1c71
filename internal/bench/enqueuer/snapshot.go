package enqueuerbench

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
)

// SnapshotOptions size RunSnapshot. Zero values take the defaults.
type SnapshotOptions struct {
	Rate     int           // staged jobs per second (default 1,000)
	Duration time.Duration // measured length of each run (default 5 min)
	// Interval is the reporting period (default 1 min, or Duration/5 when
	// Duration is shorter than 5 minutes).
	Interval time.Duration
	Warmup   time.Duration // staging before the measured part, not reported (default 5 s)
	Logf     func(format string, args ...any)
}

// SnapshotInterval is one reporting period of a run.
type SnapshotInterval struct {
	End       time.Duration // end of the period, from the start of the measured part
	Jobs      int           // jobs committed by the stagers in it
	Batches   int           // enqueuer batches that ended in it
	MeanBatch time.Duration // their mean duration
	P50, P99  time.Duration // commit-to-River latency of its jobs
	Max       time.Duration
	InsertP99 time.Duration // the stagers' own INSERT (and commit) latency
	// DeadTuples is pg_stat_user_tables.n_dead_tup of staged_jobs at the
	// end of the period.
	DeadTuples int64
	Sweeps     int           // the enqueuer's sweeps that ended in it
	MeanSweep  time.Duration // their mean duration
	// StartWalk is how long a read of the lowest staged id from the start
	// of staged_jobs_pkey took at the end of the period: what every batch
	// paid before issue 16 (it walks every dead entry), measured beside.
	StartWalk time.Duration
}

// SnapshotRun is one run: staging at a steady rate with or without a
// REPEATABLE READ transaction held open the whole time.
type SnapshotRun struct {
	Held      bool
	Intervals []SnapshotInterval
	Jobs      int
	P50, P99  time.Duration // commit-to-River latency over the whole measured run
	Max       time.Duration
	// Gaps is idemd_enqueuer_notification_gaps_total over the run, by
	// reason.
	Gaps map[string]float64
}

// First and Last are the first and last reporting periods.
func (r *SnapshotRun) First() SnapshotInterval { return r.Intervals[0] }
func (r *SnapshotRun) Last() SnapshotInterval  { return r.Intervals[len(r.Intervals)-1] }

// SnapshotReport is the outcome of RunSnapshot.
type SnapshotReport struct {
	Rate          int
	Duration      time.Duration
	Interval      time.Duration
	Without, With SnapshotRun
}

// LastVsFirst is the held run's last-period p99 over its first-period p99
// (target ≤ 2).
func (r *SnapshotReport) LastVsFirst() float64 {
	return float64(r.With.Last().P99) / float64(max(r.With.First().P99, time.Microsecond))
}

// LastVsWithout is the held run's last-period p99 over the p99 of the
// whole run without the snapshot (target ≤ 3).
func (r *SnapshotReport) LastVsWithout() float64 {
	return float64(r.With.Last().P99) / float64(max(r.Without.P99, time.Microsecond))
}

// RunSnapshot measures issue 16's failure: the enqueuer (defaults, woken by
// NOTIFY) while stagers commit Rate single-row transactions per second for
// Duration, once with nothing else running and once with a REPEATABLE READ
// transaction that took its snapshot just before the measured part and
// stays open to its end, so that no row the enqueuer moves can be vacuumed.
// Both runs are on one database in one process, the run without first. It
// reports, per Interval, the enqueuer's mean batch time, commit-to-River
// latency, the stagers' insert latency and dead tuples in staged_jobs.
func RunSnapshot(ctx context.Context, adminURL string, opts SnapshotOptions) (*SnapshotReport, error) {
	opts.Rate = cmp.Or(opts.Rate, 1000)
	opts.Duration = cmp.Or(opts.Duration, 5*time.Minute)
	if opts.Interval == 0 {
		opts.Interval = time.Minute
		if opts.Duration < 5*time.Minute {
			opts.Interval = opts.Duration / 5
		}
	}
	opts.Warmup = cmp.Or(opts.Warmup, 5*time.Second)
	if opts.Logf == nil {
		opts.Logf = func(string, ...any) {}
	}
	pool, drop, err := newDatabase(ctx, adminURL)
	if err != nil {
		return nil, err
	}
	defer drop()
	defer pool.Close()

	rep := &SnapshotReport{Rate: opts.Rate, Duration: opts.Duration, Interval: opts.Interval}
	for _, held := range []bool{false, true} {
		run, err := snapshotRun(ctx, pool, opts, held)
		if err != nil {
			return nil, fmt.Errorf("enqueuerbench snapshot (held %v): %w", held, err)
		}
		if held {
			rep.With = *run
		} else {
			rep.Without = *run
		}
	}
	return rep, nil
}

// sample is the cumulative state read at a period's end.
type sample struct {
	batches, sweeps    uint64
	batchSum, sweepSum float64
	deadTuples         int64
	startWalk          time.Duration
	gaps               map[string]float64
}

func snapshotRun(ctx context.Context, pool *pgxpool.Pool, opts SnapshotOptions, held bool) (*SnapshotRun, error) {
	logf := opts.Logf
	if _, err := pool.Exec(ctx, `TRUNCATE staged_jobs, river_job`); err != nil {
		return nil, err
	}
	if _, err := pool.Exec(ctx, `VACUUM ANALYZE staged_jobs, river_job`); err != nil {
		return nil, err
	}
	reg := prometheus.NewRegistry()
	stop, err := startService(ctx, pool.Config(), nil, reg)
	if err != nil {
		return nil, err
	}
	defer stop() //nolint:errcheck // after the explicit stop below, a no-op

	// The stagers: one row per transaction, from several connections, paced
	// against the start time. Each records when its INSERT returned (the
	// commit) and how long it took.
	const writers = 8
	type staged struct {
		id          int64
		committedAt time.Time
		took        time.Duration
	}
	var (
		mu       sync.Mutex
		rows     []staged
		firstErr error
	)
	ticks := make(chan struct{}, opts.Rate)
	var wg sync.WaitGroup
	for range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range ticks {
				start := time.Now()
				var id int64
				err := pool.QueryRow(ctx, `INSERT INTO staged_jobs (job_name, job_args) VALUES ('send_ride_receipt', '{"ride_id": 1}') RETURNING id`).Scan(&id)
				at := time.Now()
				mu.Lock()
				if err != nil && firstErr == nil {
					firstErr = err
				}
				rows = append(rows, staged{id: id, committedAt: at, took: at.Sub(start)})
				mu.Unlock()
			}
		}()
	}
	interval := time.Second / time.Duration(opts.Rate)
	pace := func(from time.Time, d time.Duration, each func(time.Time)) {
		for i := 0; ; i++ {
			at := from.Add(time.Duration(i) * interval)
			if at.Sub(from) >= d || ctx.Err() != nil {
				return
			}
			if wait := time.Until(at); wait > 0 {
				time.Sleep(wait)
			}
			if each != nil {
				each(at)
			}
			ticks <- struct{}{}
		}
	}

	// Warm-up: pools open, statements prepared, nothing measured.
	pace(time.Now(), opts.Warmup, nil)

	var holder *pgxpool.Conn
	var heldTx pgx.Tx
	if held {
		holder, err = pool.Acquire(ctx)
		if err != nil {
			return nil, err
		}
		defer holder.Release()
		heldTx, err = holder.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
		if err != nil {
			return nil, err
		}
		defer heldTx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck
		// The first statement takes the snapshot the whole run keeps.
		if _, err := heldTx.Exec(ctx, `SELECT count(*) FROM staged_jobs`); err != nil {
			return nil, err
		}
	}

	read := func() (sample, error) {
		var s sample
		fams, err := reg.Gather()
		if err != nil {
			return s, err
		}
		s.gaps = map[string]float64{}
		for _, f := range fams {
			switch f.GetName() {
			case "idemd_enqueuer_batch_duration_seconds":
				h := f.GetMetric()[0].GetHistogram()
				s.batches, s.batchSum = h.GetSampleCount(), h.GetSampleSum()
			case "idemd_enqueuer_sweep_duration_seconds":
				h := f.GetMetric()[0].GetHistogram()
				s.sweeps, s.sweepSum = h.GetSampleCount(), h.GetSampleSum()
			case "idemd_enqueuer_notification_gaps_total":
				for _, m := range f.GetMetric() {
					for _, l := range m.GetLabel() {
						if l.GetName() == "reason" {
							s.gaps[l.GetValue()] = m.GetCounter().GetValue()
						}
					}
				}
			}
		}
		// Statistics reach pg_stat_user_tables within about a second of
		// each backend's transaction: good enough at a period's end.
		err = pool.QueryRow(ctx, `SELECT coalesce((SELECT n_dead_tup FROM pg_stat_user_tables WHERE relname = 'staged_jobs'), 0)`).Scan(&s.deadTuples)
		if err != nil {
			return s, err
		}
		s.startWalk, err = startWalk(ctx, pool)
		return s, err
	}
	base, err := read()
	if err != nil {
		return nil, err
	}
	start := time.Now()
	mu.Lock()
	warmRows := len(rows)
	mu.Unlock()
	logf("snapshot run (held snapshot: %v): %d jobs/s for %s", held, opts.Rate, opts.Duration)

	// The measured part, with a sample at each period's end.
	var samples []sample
	var sampleErr error
	periods := int((opts.Duration + opts.Interval - 1) / opts.Interval)
	nextSample := start.Add(opts.Interval)
	pace(start, opts.Duration, func(at time.Time) {
		if at.Before(nextSample) || len(samples) >= periods-1 {
			return
		}
		s, err := read()
		if err != nil && sampleErr == nil {
			sampleErr = err
		}
		prev := base
		if len(samples) > 0 {
			prev = samples[len(samples)-1]
		}
		samples = append(samples, s)
		mean := time.Duration(0)
		if n := s.batches - prev.batches; n > 0 {
			mean = time.Duration((s.batchSum - prev.batchSum) / float64(n) * float64(time.Second))
		}
		logf("  %s: %d batches, mean %s; %d dead tuples in staged_jobs; a walk from the index start %s",
			nextSample.Sub(start).Round(time.Second), s.batches-prev.batches, mean, s.deadTuples, s.startWalk)
		nextSample = nextSample.Add(opts.Interval)
	})
	close(ticks)
	wg.Wait()
	end, err := read()
	if err != nil {
		return nil, err
	}
	samples = append(samples, end)
	if firstErr != nil {
		return nil, firstErr
	}
	if sampleErr != nil {
		return nil, sampleErr
	}

	// Every row moves (with the snapshot still held), then the snapshot
	// and the service end.
	deadline := time.Now().Add(2 * time.Minute)
	for {
		var left int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM staged_jobs`).Scan(&left); err != nil {
			return nil, err
		}
		if left == 0 {
			break
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("%d rows never moved", left)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if heldTx != nil {
		if err := heldTx.Rollback(ctx); err != nil {
			return nil, err
		}
	}
	if err := stop(); err != nil {
		return nil, err
	}

	// commit-to-River latency per job, from River's created_at (now() of
	// the enqueuer's move transaction, which began just before its take;
	// both clocks are this machine's).
	movedAt := make(map[int64]time.Time, len(rows))
	dbRows, err := pool.Query(ctx, `SELECT (metadata->>'idemd_staged_id')::bigint, created_at FROM river_job`)
	if err != nil {
		return nil, err
	}
	for dbRows.Next() {
		var id int64
		var at time.Time
		if err := dbRows.Scan(&id, &at); err != nil {
			return nil, err
		}
		if _, dup := movedAt[id]; dup {
			return nil, fmt.Errorf("staged id %d has two River jobs", id)
		}
		movedAt[id] = at
	}
	if err := dbRows.Err(); err != nil {
		return nil, err
	}
	if len(movedAt) != len(rows) {
		return nil, fmt.Errorf("%d River jobs for %d staged rows", len(movedAt), len(rows))
	}

	run := &SnapshotRun{Held: held, Gaps: map[string]float64{}}
	for k, v := range end.gaps {
		run.Gaps[k] = v - base.gaps[k]
	}
	lats := make([][]time.Duration, len(samples))
	inserts := make([][]time.Duration, len(samples))
	var all []time.Duration
	for _, r := range rows[warmRows:] {
		at, ok := movedAt[r.id]
		if !ok {
			return nil, fmt.Errorf("staged id %d has no River job", r.id)
		}
		p := min(int(r.committedAt.Sub(start)/opts.Interval), len(samples)-1)
		if p < 0 {
			continue // committed before the measured part began
		}
		lat := max(at.Sub(r.committedAt), 0)
		lats[p] = append(lats[p], lat)
		inserts[p] = append(inserts[p], r.took)
		all = append(all, lat)
	}
	prev := base
	for i, s := range samples {
		iv := SnapshotInterval{
			End:        min(time.Duration(i+1)*opts.Interval, opts.Duration),
			Jobs:       len(lats[i]),
			Batches:    int(s.batches - prev.batches),
			DeadTuples: s.deadTuples,
			Sweeps:     int(s.sweeps - prev.sweeps),
			StartWalk:  s.startWalk,
		}
		if iv.Batches > 0 {
			iv.MeanBatch = time.Duration((s.batchSum - prev.batchSum) / float64(iv.Batches) * float64(time.Second))
		}
		if iv.Sweeps > 0 {
			iv.MeanSweep = time.Duration((s.sweepSum - prev.sweepSum) / float64(iv.Sweeps) * float64(time.Second))
		}
		iv.P50, iv.P99, iv.Max = percentiles(lats[i])
		_, iv.InsertP99, _ = percentiles(inserts[i])
		run.Intervals = append(run.Intervals, iv)
		prev = s
	}
	run.Jobs = len(all)
	run.P50, run.P99, run.Max = percentiles(all)
	if run.Jobs == 0 {
		return nil, fmt.Errorf("no job was staged in the measured part")
	}
	return run, nil
}

// startWalk times a read of the lowest staged id through staged_jobs_pkey
// from its start (the other scans switched off, as the enqueuer does).
func startWalk(ctx context.Context, pool *pgxpool.Pool) (time.Duration, error) {
	var d time.Duration
	err := pgx.BeginTxFunc(ctx, pool, pgx.TxOptions{BeginQuery: "BEGIN; SET LOCAL enable_seqscan = off; SET LOCAL enable_bitmapscan = off"}, func(tx pgx.Tx) error {
		start := time.Now()
		var id *int64
		err := tx.QueryRow(ctx, `SELECT id FROM staged_jobs ORDER BY id LIMIT 1`).Scan(&id)
		if err == pgx.ErrNoRows {
			err = nil
		}
		d = time.Since(start)
		return err
	})
	return d, err
}

// percentiles returns p50, p99 and max of ds (sorting it).
func percentiles(ds []time.Duration) (p50, p99, mx time.Duration) {
	if len(ds) == 0 {
		return 0, 0, 0
	}
	slices.Sort(ds)
	pct := func(p float64) time.Duration { return ds[min(len(ds)-1, int(p*float64(len(ds))))] }
	return pct(0.50), pct(0.99), ds[len(ds)-1]
}
