package reaperbench

import (
	"context"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/idemd/idemd/internal/reaper"
	"github.com/idemd/idemd/internal/testing/dbtest"
)

func TestMain(m *testing.M) { dbtest.Main(m) }

// BenchmarkReaper runs the whole comparison at a small size so `go test
// -bench` exercises it; the report's numbers come from a full-size Run.
func BenchmarkReaper(b *testing.B) {
	admin := dbtest.ServerURL(b)
	for b.Loop() {
		r, err := Run(context.Background(), admin, Options{Keys: 20000, BaselineDuration: time.Second, LatencyRounds: 1, ThroughputRounds: 1, Logf: b.Logf})
		if err != nil {
			b.Fatal(err)
		}
		b.ReportMetric(r.Rows[0].KeysPerSec, "reaper-keys/s")
		b.ReportMetric(r.Rows[0].VsArticle, "x-article")
		b.ReportMetric(r.Rows[0].VsSingle, "x-single")
		b.ReportMetric(float64(r.IdleReaper.Microseconds()), "idle-µs")
		b.ReportMetric(r.Insert.P99RoundMedian, "x-insert-p99")
		b.Log("\n" + r.String())
	}
}

// TestRunSmall checks the benchmark itself works (every strategy deletes
// exactly the old half).
func TestRunSmall(t *testing.T) {
	r, err := Run(context.Background(), dbtest.ServerURL(t), Options{Keys: 4000, BaselineDuration: 200 * time.Millisecond, LatencyRounds: 1})
	if err != nil {
		t.Fatal(err)
	}
	for _, row := range r.Rows {
		if row.Deleted != int64(r.PastRetention) {
			t.Errorf("%s deleted %d, want %d", row.Name, row.Deleted, r.PastRetention)
		}
	}
	t.Log("\n" + r.String())
}

// TestFullRun runs the benchmark at the size REAPERBENCH_KEYS (skipped when
// unset), optionally with REAPERBENCH_BATCH, REAPERBENCH_PAUSE,
// REAPERBENCH_CONCURRENCY (of the extra runs; 1 skips them) and
// REAPERBENCH_RIDES_ONLY (only the runs with the rides foreign key):
//
//	REAPERBENCH_KEYS=2000000 go test -run TestFullRun -v -timeout 1h ./internal/bench/reaper
func TestFullRun(t *testing.T) {
	keys, _ := strconv.Atoi(os.Getenv("REAPERBENCH_KEYS"))
	if keys == 0 {
		t.Skip("REAPERBENCH_KEYS not set")
	}
	s := reaper.DefaultSettings()
	s.Throttle.MaxLoad = "" // as Run's default: the batches' speed, not the server's WAL budget
	if v, err := strconv.Atoi(os.Getenv("REAPERBENCH_BATCH")); err == nil {
		s.BatchSize = v
	}
	if v, err := time.ParseDuration(os.Getenv("REAPERBENCH_PAUSE")); err == nil {
		s.BatchPause = v
	}
	rounds, _ := strconv.Atoi(os.Getenv("REAPERBENCH_ROUNDS"))
	concurrency, _ := strconv.Atoi(os.Getenv("REAPERBENCH_CONCURRENCY"))
	r, err := Run(context.Background(), dbtest.ServerURL(t), Options{LatencyRounds: rounds, Keys: keys, Reaper: &s, SkipRides: os.Getenv("REAPERBENCH_SKIP_RIDES") != "",
		RidesOnly: os.Getenv("REAPERBENCH_RIDES_ONLY") != "", Concurrency: concurrency,
		LatencyOnly: os.Getenv("REAPERBENCH_LATENCY_ONLY") != "", Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	t.Log("\n" + r.String())
}

// TestRunStandbySmall checks the benchmark with a standby works: every
// configuration deletes the keys past retention when it starts (and at
// most the one or two that cross the horizon while it runs: at 20000 keys
// over 144 hours, one every 26 s), and the lag is sampled.
func TestRunStandbySmall(t *testing.T) {
	r, err := RunStandby(context.Background(), StandbyOptions{Keys: 20000, BaselineDuration: 200 * time.Millisecond, Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Configs) != len(StandbyConfigKeys) {
		t.Fatalf("%d configurations measured, want %d", len(r.Configs), len(StandbyConfigKeys))
	}
	for _, c := range r.Configs {
		if len(c.Rounds) != 1 || len(c.P99Ratios) != 1 || c.P99Median != c.P99Ratios[0] {
			t.Fatalf("%s: %d rounds, p99 ratios %v (median %v), want one round", c.Key, len(c.Rounds), c.P99Ratios, c.P99Median)
		}
		row := c.Rounds[0]
		if row.Deleted < row.Eligible || row.Deleted > row.Eligible+2 || row.Eligible < int64(r.PastRetention) || !row.Complete ||
			row.WALBytes <= 0 || len(row.Timeline) == 0 || row.During.N == 0 || row.Before.N == 0 || row.Load <= 0 ||
			row.LateDuring.N != row.During.N || row.WaitsBefore.Samples == 0 || row.WaitsDuring.Samples == 0 {
			t.Errorf("%s: deleted %d of %d eligible (%d at load), complete %v, %d bytes of WAL, %d lag samples, %d/%d inserts (%d timed leaving), loaded in %s, waits sampled %d/%d times",
				row.Name, row.Deleted, row.Eligible, r.PastRetention, row.Complete, row.WALBytes, len(row.Timeline), row.Before.N, row.During.N, row.LateDuring.N, row.Load, row.WaitsBefore.Samples, row.WaitsDuring.Samples)
		}
	}
	if r.Configs[0].VsFirstMedian != 1 {
		t.Errorf("the first configuration's keys/s against itself: %v, want 1", r.Configs[0].VsFirstMedian)
	}
	t.Log("\n" + r.String())
}

// TestSummarize checks a configuration's medians over interleaved rounds:
// each round's keys/s against the first configuration's in the same round.
func TestSummarize(t *testing.T) {
	first := []StandbyRow{{KeysPerSec: 100}, {KeysPerSec: 200}, {KeysPerSec: 50}}
	rows := []StandbyRow{
		{KeysPerSec: 90, P99Ratio: 3, WALBytes: 10, LagMax: time.Second, Complete: true},
		{KeysPerSec: 220, P99Ratio: 1, WALBytes: 30, LagMax: 2 * time.Second, LagOver1s: 0.5},
		{KeysPerSec: 40, P99Ratio: 2, WALBytes: 20, Complete: true},
	}
	c := summarize("k", "name", rows, first)
	if c.P99Median != 2 || c.KeysPerSecMedian != 90 || c.WALMedian != 20 || c.VsFirstMedian != 0.9 ||
		c.LagMax != 2*time.Second || c.LagOver1s != 0.5 || c.Incomplete != 1 {
		t.Errorf("summarize = %+v", c)
	}
}

// TestStandbyFullRun runs the benchmark with a standby at the size
// REAPERBENCH_STANDBY_KEYS (skipped when unset; 2000000 reaps 1M keys,
// 20000000 the full suite's 10M), REAPERBENCH_STANDBY_ROUNDS interleaved
// rounds (default 1), and only the configurations of
// REAPERBENCH_STANDBY_CONFIGS (comma-separated keys of StandbyConfigKeys;
// default all), on a server with REAPERBENCH_STANDBY_SERVER's settings
// (comma-separated name=value; default PostgreSQL's), each run bounded by
// REAPERBENCH_STANDBY_MAX_RUNTIME (default 10m), with the reaper's log
// (debug level, JSON lines) in the file REAPERBENCH_REAPER_LOG:
//
//	REAPERBENCH_STANDBY_KEYS=2000000 REAPERBENCH_STANDBY_ROUNDS=3 go test -run TestStandbyFullRun -v -timeout 2h ./internal/bench/reaper
func TestStandbyFullRun(t *testing.T) {
	keys, _ := strconv.Atoi(os.Getenv("REAPERBENCH_STANDBY_KEYS"))
	if keys == 0 {
		t.Skip("REAPERBENCH_STANDBY_KEYS not set")
	}
	rounds, _ := strconv.Atoi(os.Getenv("REAPERBENCH_STANDBY_ROUNDS"))
	var configs []string
	if v := os.Getenv("REAPERBENCH_STANDBY_CONFIGS"); v != "" {
		configs = strings.Split(v, ",")
	}
	var server []string
	if v := os.Getenv("REAPERBENCH_STANDBY_SERVER"); v != "" {
		server = strings.Split(v, ",")
	}
	o := StandbyOptions{Keys: keys, Rounds: rounds, Configs: configs, Server: server, Logf: t.Logf}
	if v := os.Getenv("REAPERBENCH_STANDBY_MAX_RUNTIME"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			t.Fatalf("REAPERBENCH_STANDBY_MAX_RUNTIME=%q: want a positive duration (20m)", v)
		}
		o.MaxRuntime = d
	}
	if path := os.Getenv("REAPERBENCH_REAPER_LOG"); path != "" {
		cfg := zap.NewProductionConfig()
		cfg.Level, cfg.OutputPaths, cfg.Sampling = zap.NewAtomicLevelAt(zap.DebugLevel), []string{path}, nil
		l, err := cfg.Build()
		if err != nil {
			t.Fatal(err)
		}
		defer l.Sync() //nolint:errcheck // a file's last lines
		o.ReaperLog = l
	}
	r, err := RunStandby(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	t.Log("\n" + r.String())
}

// TestWALWindows checks the WAL rate per 10 s window: whole windows one
// after the other, and the extremes over the windows starting at any
// sample.
func TestWALWindows(t *testing.T) {
	t0 := time.Date(2026, 12, 7, 10, 0, 0, 0, time.UTC)
	var xs []LagSample
	// 1 MB/s for 20 s, then 3 MB/s for 10 s, a sample a second.
	wal := int64(0)
	for s := 0; s <= 30; s++ {
		xs = append(xs, LagSample{WAL: wal, ServerAt: t0.Add(time.Duration(s) * time.Second)})
		if s < 20 {
			wal += 1 << 20
		} else {
			wal += 3 << 20
		}
	}
	got, hi, lo := walWindows(xs)
	want := []float64{1 << 20, 1 << 20, 3 << 20}
	if len(got) != len(want) || got[0] != want[0] || got[1] != want[1] || got[2] != want[2] || hi != 3<<20 || lo != 1<<20 {
		t.Fatalf("walWindows = %v, %v, %v; want %v, %v, %v", got, hi, lo, want, float64(3<<20), float64(1<<20))
	}
	if got, hi, lo := walWindows(xs[:5]); len(got) != 0 || hi != 0 || lo != 0 {
		t.Fatalf("under 10 s of samples: %v, %v, %v", got, hi, lo)
	}
}

// TestWaitsString checks the waits' rendering: the commonest first, as
// shares of the inserts in flight, ties by name.
func TestWaitsString(t *testing.T) {
	w := Waits{Samples: 50, InFlight: 20, By: map[string]int{"CPU": 4, "LWLock:WALWrite": 10, "IO:WALSync": 4, "Lock:relation": 1, "IO:DataFileRead": 1}}
	want := "LWLock:WALWrite 50%, CPU 20%, IO:WALSync 20%, IO:DataFileRead 5% (20 inserts in flight in 50 samples)"
	if got := w.String(); got != want {
		t.Errorf("got %q, want %q", got, want)
	}
	if got := (Waits{Samples: 3}).String(); got != "no insert in flight in 3 samples" {
		t.Errorf("empty: got %q", got)
	}
}

// TestP99Windows checks the inserts' p99 per whole 10 s of a run: by when
// each insert was due, the last partial window left out.
func TestP99Windows(t *testing.T) {
	start := time.Date(2026, 12, 7, 0, 0, 0, 0, time.UTC)
	var w timedInserts
	add := func(at time.Duration, lat time.Duration) {
		w.due = append(w.due, start.Add(at))
		w.lat = append(w.lat, lat)
	}
	for i := range 100 {
		add(time.Duration(i)*100*time.Millisecond, time.Millisecond) // 0-9.9 s: 1 ms each
	}
	for i := range 100 {
		lat := time.Millisecond
		if i >= 90 {
			lat = 50 * time.Millisecond // the second window's tail
		}
		add(10*time.Second+time.Duration(i)*100*time.Millisecond, lat)
	}
	add(20*time.Second, 900*time.Millisecond) // a partial third window
	got := p99Windows(w, start)
	if len(got) != 2 || got[0] != time.Millisecond || got[1] != 50*time.Millisecond {
		t.Errorf("p99 per window: %v, want [1ms 50ms]", got)
	}
}

// TestWindowEvents checks the marks of a run's 10 s windows: a VACUUM
// seen in any sample of a window, a checkpoint begun between two samples.
func TestWindowEvents(t *testing.T) {
	xs := []LagSample{
		{At: 0, Checkpoints: 4},
		{At: 5 * time.Second, Checkpoints: 4, Vacuuming: true},
		{At: 12 * time.Second, Checkpoints: 4},
		{At: 21 * time.Second, Checkpoints: 5, Vacuuming: true},
		{At: 31 * time.Second, Checkpoints: 5},
	}
	xs[2].Dirty = 300 << 20
	xs[3].Dirty = dirtyMark // not over the mark
	got := windowEvents(xs, 3)
	if want := []string{"v", "d300", "vc"}; !slices.Equal(got, want) {
		t.Errorf("events %q, want %q", got, want)
	}
	if got := p99List([]time.Duration{time.Millisecond, 2500 * time.Microsecond}, []string{"", "vc"}); got != "1.0 2.5vc" {
		t.Errorf("p99 list %q", got)
	}
}
