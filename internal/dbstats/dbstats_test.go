package dbstats

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/idemd/idemd/internal/config"
	"github.com/idemd/idemd/internal/riverdb"
	"github.com/idemd/idemd/internal/runhistory"
	"github.com/idemd/idemd/internal/testing/dbtest"
	"github.com/idemd/idemd/internal/testing/testwait"
)

func TestMain(m *testing.M) { dbtest.Main(m) }

func TestBuildStats(t *testing.T) {
	t.Parallel()
	zero := func(over map[string]int64) map[string]int64 {
		m := map[string]int64{"available": 0, "pending": 0, "retryable": 0, "running": 0, "scheduled": 0}
		for k, v := range over {
			m[k] = v
		}
		return m
	}
	for _, tc := range []struct {
		name  string
		rows  []statsRow
		known []string
		want  []QueueStats
	}{
		{name: "nothing at all", want: []QueueStats{}},
		{
			name: "every state of a queue exported, the oldest available job's age",
			rows: []statsRow{
				{"default", "available", 3, 600.5},
				{"default", "scheduled", 2, 0},
				{"default", "running", 1, 30},
			},
			want: []QueueStats{{Queue: "default", Jobs: zero(map[string]int64{"available": 3, "scheduled": 2, "running": 1}), OldestAvailableAge: 600500 * time.Millisecond}},
		},
		{
			name:  "a drained queue seen before stays, at 0; queues sorted",
			rows:  []statsRow{{"mail", "retryable", 1, 5}},
			known: []string{"default"},
			want: []QueueStats{
				{Queue: "default", Jobs: zero(nil)},
				{Queue: "mail", Jobs: zero(map[string]int64{"retryable": 1})},
			},
		},
		{
			name: "a state this version does not count is left out",
			rows: []statsRow{{"default", "completed", 1000, 0}, {"default", "pending", 1, 0}},
			want: []QueueStats{{Queue: "default", Jobs: zero(map[string]int64{"pending": 1})}},
		},
		{
			name: "no negative age",
			rows: []statsRow{{"default", "available", 1, -3}},
			want: []QueueStats{{Queue: "default", Jobs: zero(map[string]int64{"available": 1})}},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			known := map[string]bool{}
			for _, q := range tc.known {
				known[q] = true
			}
			if got := buildStats(tc.rows, known); !reflect.DeepEqual(got, tc.want) {
				t.Errorf("buildStats:\n got %+v\nwant %+v", got, tc.want)
			}
		})
	}
}

func TestSettingsCheck(t *testing.T) {
	t.Parallel()
	d := DefaultSettings()
	if p := d.Check(); len(p) > 0 {
		t.Errorf("the defaults are refused: %v", p)
	}
	bad := Settings{Interval: 0, LeaseTTL: 10 * time.Second, StatementTimeout: -time.Second}
	got := strings.Join(bad.Check(), "\n")
	for _, want := range []string{"--db-stats-interval must be positive", "--db-stats-statement-timeout must be positive"} {
		if !strings.Contains(got, want) {
			t.Errorf("Check() = %q, want it to say %q", got, want)
		}
	}
	short := Settings{Interval: 30 * time.Second, LeaseTTL: 35 * time.Second, StatementTimeout: 10 * time.Second}
	if got := strings.Join(short.Check(), "\n"); !strings.Contains(got, "--db-stats-lease-ttl 35s must be longer than --db-stats-interval 30s plus --db-stats-statement-timeout 10s") {
		t.Errorf("a lease shorter than a pass: Check() = %q", got)
	}
	_, err := New(Config{Settings: bad})
	var ce *config.Error
	if !errors.As(err, &ce) || len(ce.Problems) != 3 {
		t.Errorf("New with bad settings and no pool: %v, want a *config.Error with 3 problems", err)
	}
}

// testSettings pass quickly; the lease outlives a pass.
func testSettings() Settings {
	return Settings{Interval: 20 * time.Millisecond, LeaseTTL: 30 * time.Second, StatementTimeout: 5 * time.Second}
}

func newService(t *testing.T, pool *pgxpool.Pool, s Settings) (*Service, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	svc, err := New(Config{Settings: s, Pool: pool, Registry: reg})
	if err != nil {
		t.Fatal(err)
	}
	return svc, reg
}

// job is a river_job row for a test.
type job struct {
	queue, state string
	scheduledAt  time.Time
}

func insertJobs(t *testing.T, pool *pgxpool.Pool, jobs ...job) {
	t.Helper()
	for _, j := range jobs {
		_, err := pool.Exec(context.Background(), `
INSERT INTO river_job (state, queue, kind, args, scheduled_at, finalized_at, attempted_at, attempt)
VALUES (@state::river_job_state, @queue, 'test_kind', '{}', @scheduled_at,
        CASE WHEN @state IN ('completed', 'cancelled', 'discarded') THEN @scheduled_at::timestamptz END,
        CASE WHEN @state IN ('running', 'retryable') THEN @scheduled_at::timestamptz END,
        CASE WHEN @state IN ('running', 'retryable') THEN 1 ELSE 0 END)`,
			pgx.NamedArgs{"state": j.state, "queue": j.queue, "scheduled_at": j.scheduledAt})
		if err != nil {
			t.Fatalf("insert %+v: %v", j, err)
		}
	}
}

// exported returns what reg exports of the stats, as "name{labels} value"
// lines, sorted by Gather.
func exported(t *testing.T, reg *prometheus.Registry) []string {
	t.Helper()
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, f := range fams {
		if f.GetName() == "idemd_dbstats_passes_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			var l []string
			for _, lp := range m.GetLabel() {
				l = append(l, fmt.Sprintf("%s=%q", lp.GetName(), lp.GetValue()))
			}
			out = append(out, fmt.Sprintf("%s{%s} %v", f.GetName(), strings.Join(l, ","), m.GetGauge().GetValue()))
		}
	}
	return out
}

// exportedStats is exported without the xmin horizon's gauges, which the
// tests of horizon_test.go check: River's and the reaper's numbers.
func exportedStats(t *testing.T, reg *prometheus.Registry) []string {
	t.Helper()
	var out []string
	for _, line := range exported(t, reg) {
		if !strings.HasPrefix(line, "idemd_db_") && !strings.HasPrefix(line, "idemd_dbstats_read_all_stats{") {
			out = append(out, line)
		}
	}
	return out
}

func exporting(t *testing.T, reg *prometheus.Registry) bool {
	t.Helper()
	for _, line := range exported(t, reg) {
		if line == "idemd_dbstats_exporter{} 1" {
			return true
		}
	}
	return false
}

// TestStats counts River's jobs in real tables: live states by queue, the
// oldest available job's age by a pinned clock, finalized jobs left out,
// and a drained queue kept at 0.
func TestStats(t *testing.T) {
	t.Parallel()
	pool := dbtest.NewPool(t)
	ctx := context.Background()
	now := time.Date(2026, 6, 1, 12, 0, 0, 0, time.UTC)
	insertJobs(t, pool,
		job{"default", "available", now.Add(-10 * time.Minute)},
		job{"default", "available", now.Add(-5 * time.Minute)},
		job{"default", "available", now.Add(-time.Minute)},
		job{"default", "scheduled", now.Add(time.Hour)},
		job{"default", "running", now.Add(-2 * time.Minute)},
		job{"default", "running", now.Add(-time.Minute)},
		job{"default", "retryable", now.Add(time.Minute)},
		job{"default", "completed", now.Add(-48 * time.Hour)},
		job{"default", "discarded", now.Add(-48 * time.Hour)},
		job{"default", "cancelled", now.Add(-48 * time.Hour)},
		job{"mail", "pending", now.Add(-time.Hour)},
		job{"mail", "available", now.Add(time.Minute)}, // due in the future by the pinned clock: age 0
		job{"archive", "completed", now.Add(-time.Hour)},
	)
	svc, reg := newService(t, pool, testSettings())
	svc.pinnedNow = &now

	res, err := svc.RunOnce(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !res.Exporting || res.Holder != "" || res.TookOverFrom != "" {
		t.Errorf("a lone exporter: %+v", res)
	}
	// The reaper's history has no complete run: its gauge is absent.
	want := []string{
		`idemd_dbstats_exporter{} 1`,
		`idemd_river_jobs{queue="default",state="available"} 3`,
		`idemd_river_jobs{queue="default",state="pending"} 0`,
		`idemd_river_jobs{queue="default",state="retryable"} 1`,
		`idemd_river_jobs{queue="default",state="running"} 2`,
		`idemd_river_jobs{queue="default",state="scheduled"} 1`,
		`idemd_river_jobs{queue="mail",state="available"} 1`,
		`idemd_river_jobs{queue="mail",state="pending"} 1`,
		`idemd_river_jobs{queue="mail",state="retryable"} 0`,
		`idemd_river_jobs{queue="mail",state="running"} 0`,
		`idemd_river_jobs{queue="mail",state="scheduled"} 0`,
		`idemd_river_oldest_available_age_seconds{queue="default"} 600`,
		`idemd_river_oldest_available_age_seconds{queue="mail"} 0`,
	}
	if got := exportedStats(t, reg); strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("exported:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}

	// The mail queue drains: it stays, at 0.
	if _, err := pool.Exec(ctx, `DELETE FROM river_job WHERE queue = 'mail'`); err != nil {
		t.Fatal(err)
	}
	res, err = svc.RunOnce(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Queues) != 2 || res.Queues[1].Queue != "mail" || res.Queues[1].Jobs["pending"] != 0 || res.Queues[1].Jobs["available"] != 0 {
		t.Errorf("after draining mail: %+v", res.Queues)
	}
}

// TestReaperLastSuccess: the exporter exports the end of the reaper run
// history's last complete run, whichever process ran it: absent (not 0)
// while the history has none, a CronJob's run at the first pass, a later
// run's end at the pass after it; a standby replica exports none.
func TestReaperLastSuccess(t *testing.T) {
	t.Parallel()
	pool := dbtest.NewPool(t)
	ctx := context.Background()
	const gauge = "idemd_reaper_history_last_success_timestamp_seconds"
	value := func(reg *prometheus.Registry) (float64, bool) {
		t.Helper()
		prefix := gauge + "{} "
		for _, line := range exported(t, reg) {
			if v, ok := strings.CutPrefix(line, prefix); ok {
				var f float64
				if _, err := fmt.Sscan(v, &f); err != nil {
					t.Fatal(err)
				}
				return f, true
			}
		}
		return 0, false
	}
	unix := func(at time.Time) float64 { return float64(at.UnixNano()) / 1e9 }

	// Runs, but none complete: a failed one, one that found the lease held.
	if _, err := pool.Exec(ctx, `
INSERT INTO idemd_reaper_runs (started_at, finished_at, mode, result, error, holder) VALUES
    (now() - interval '3 hours', now() - interval '3 hours' + interval '1 second', 'once', 'error', 'the --max-deletes cap', 'reaper/cronjob-pod/1/aa'),
    (now() - interval '2 hours', now() - interval '2 hours', 'once', 'lock_held', NULL, 'reaper/cronjob-pod/1/bb')`); err != nil {
		t.Fatal(err)
	}
	svc, reg := newService(t, pool, testSettings())
	res, err := svc.RunOnce(ctx)
	if err != nil || !res.Exporting || res.ReaperLastSuccess != nil {
		t.Fatalf("pass over a history without a complete run: %+v, %v", res, err)
	}
	if v, ok := value(reg); ok || !exporting(t, reg) {
		t.Fatalf("without a complete run: %s = %v (exported %v), want it absent from an exporting replica", gauge, v, exported(t, reg))
	}

	// A CronJob's run completes.
	var cronJobEnd time.Time
	if err := pool.QueryRow(ctx, `
INSERT INTO idemd_reaper_runs (started_at, finished_at, mode, result, holder)
VALUES (now() - interval '2 hours', now() - interval '2 hours' + interval '5 seconds', 'once', 'complete', 'reaper/cronjob-pod/1/ab')
RETURNING finished_at`).Scan(&cronJobEnd); err != nil {
		t.Fatal(err)
	}
	if res, err = svc.RunOnce(ctx); err != nil || res.ReaperLastSuccess == nil || !res.ReaperLastSuccess.Equal(cronJobEnd) {
		t.Fatalf("pass after the CronJob's run: %+v, %v; want its end %v", res, err, cronJobEnd)
	}
	if v, ok := value(reg); !ok || v != unix(cronJobEnd) {
		t.Fatalf("%s = %v (exported %v), want the CronJob run's end %v", gauge, v, ok, unix(cronJobEnd))
	}

	// A later run, as a --schedule reaper records it.
	run, err := runhistory.Start(ctx, pool, 0, runhistory.ModeSchedule, "reaper/deploy-pod/1/cd", runhistory.Settings{})
	if err != nil {
		t.Fatal(err)
	}
	if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		return runhistory.End(ctx, tx, run, runhistory.Outcome{Result: runhistory.ResultComplete})
	}); err != nil {
		t.Fatal(err)
	}
	runs, err := runhistory.LastRuns(ctx, pool, 1)
	if err != nil || len(runs) != 1 || runs[0].ID != run || runs[0].FinishedAt == nil {
		t.Fatalf("last run %+v, %v", runs, err)
	}
	if _, err := svc.RunOnce(ctx); err != nil {
		t.Fatal(err)
	}
	if v, ok := value(reg); !ok || v != unix(*runs[0].FinishedAt) {
		t.Fatalf("%s = %v (exported %v) after the scheduled run, want its end %v", gauge, v, ok, unix(*runs[0].FinishedAt))
	}

	// The newest run that took the lease was never throttled: 0. A run
	// that waited 30 of its 40 seconds: 0.75. A later run that found the
	// lease held does not count.
	if res, err := svc.RunOnce(ctx); err != nil || res.ReaperThrottled == nil || *res.ReaperThrottled != 0 {
		t.Fatalf("throttled share of an unthrottled run: %+v, %v", res, err)
	}
	if _, err := pool.Exec(ctx, `
INSERT INTO idemd_reaper_runs (started_at, finished_at, mode, result, holder, throttled_seconds, throttle_reason) VALUES
    (now() - interval '1 minute', now() - interval '20 seconds', 'once', 'incomplete', 'reaper/cronjob-pod/1/ef', 30, 'replica_lag'),
    (now() - interval '10 seconds', now() - interval '10 seconds', 'once', 'lock_held', 'reaper/cronjob-pod/1/gh', 0, NULL)`); err != nil {
		t.Fatal(err)
	}
	if res, err := svc.RunOnce(ctx); err != nil || res.ReaperThrottled == nil || *res.ReaperThrottled != 0.75 {
		t.Fatalf("throttled share of a run throttled 30s of 40s: %+v, %v", res, err)
	}
	if !slices.Contains(exported(t, reg), "idemd_reaper_history_last_run_throttled_ratio{} 0.75") {
		t.Fatalf("exported %v, want the throttled ratio 0.75", exported(t, reg))
	}

	// A second replica stands by and exports none of it.
	standby, regB := newService(t, pool, testSettings())
	if res, err := standby.RunOnce(ctx); err != nil || res.Exporting || res.ReaperLastSuccess != nil {
		t.Fatalf("standby pass: %+v, %v", res, err)
	}
	if v, ok := value(regB); ok {
		t.Fatalf("the standby replica exports %s = %v", gauge, v)
	}
}

// TestOneExporterAmongReplicas: of two replicas only the lease holder
// counts and exports; the other exports no stats and says it is not the
// exporter. When the holder's lease expires (it died), the other takes it
// over, and the old holder, back, stands by.
func TestOneExporterAmongReplicas(t *testing.T) {
	t.Parallel()
	pool := dbtest.NewPool(t)
	ctx := context.Background()
	insertJobs(t, pool, job{"default", "available", time.Now()})
	a, regA := newService(t, pool, testSettings())
	b, regB := newService(t, pool, testSettings())

	ra, err := a.RunOnce(ctx)
	if err != nil || !ra.Exporting {
		t.Fatalf("first replica: %+v, %v", ra, err)
	}
	rb, err := b.RunOnce(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if rb.Exporting || rb.Holder != a.holder {
		t.Errorf("second replica: %+v, want standby with holder %s", rb, a.holder)
	}
	if got := exported(t, regB); len(got) != 1 || got[0] != "idemd_dbstats_exporter{} 0" {
		t.Errorf("the standby replica exports %q, want only idemd_dbstats_exporter 0", got)
	}
	if !exporting(t, regA) {
		t.Error("the holder does not export")
	}
	// The holder renews at every pass: b still stands by.
	if ra, err = a.RunOnce(ctx); err != nil || !ra.Exporting {
		t.Fatalf("holder's second pass: %+v, %v", ra, err)
	}
	if rb, err = b.RunOnce(ctx); err != nil || rb.Exporting {
		t.Fatalf("standby's second pass: %+v, %v", rb, err)
	}

	// a dies: its lease expires without a release.
	if _, err := pool.Exec(ctx, `UPDATE idemd_leases SET expires_at = clock_timestamp() - interval '1 second' WHERE name = $1`, LeaseName); err != nil {
		t.Fatal(err)
	}
	rb, err = b.RunOnce(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !rb.Exporting || rb.TookOverFrom != a.holder {
		t.Errorf("after the holder's lease expired: %+v, want b exporting, taken over from %s", rb, a.holder)
	}
	ra, err = a.RunOnce(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if ra.Exporting || ra.Holder != b.holder {
		t.Errorf("the old holder came back: %+v, want standby behind %s", ra, b.holder)
	}
	if exporting(t, regA) || !exporting(t, regB) {
		t.Errorf("exporters after the takeover: a %v, b %v", exported(t, regA), exported(t, regB))
	}
}

// TestStopHandsOver runs two replicas with Start: exactly one exports, and
// when it stops (releasing the lease) the other takes over at its next
// pass. Waits are polls; nothing sleeps.
func TestStopHandsOver(t *testing.T) {
	t.Parallel()
	pool := dbtest.NewPool(t)
	ctx := context.Background()
	insertJobs(t, pool, job{"default", "available", time.Now()})
	a, regA := newService(t, pool, testSettings())
	b, regB := newService(t, pool, testSettings())
	for _, s := range []*Service{a, b} {
		if err := s.Start(ctx); err != nil {
			t.Fatal(err)
		}
	}
	stopped := map[*Service]bool{}
	t.Cleanup(func() {
		for _, s := range []*Service{a, b} {
			if !stopped[s] {
				_ = s.Stop(ctx)
			}
		}
	})
	testwait.Until(t, time.Minute, "one replica exporting", func() bool {
		return exporting(t, regA) != exporting(t, regB)
	})
	holder, standby, standbyReg := a, b, regB
	if exporting(t, regB) {
		holder, standby, standbyReg = b, a, regA
	}
	// Both keep passing; the standby never exports meanwhile.
	passes := func(s *Service, result string) float64 {
		return testutil.ToFloat64(s.metrics.passes.WithLabelValues(result))
	}
	base := passes(standby, passStandby)
	testwait.Until(t, time.Minute, "the standby passing twice more", func() bool { return passes(standby, passStandby) >= base+2 })
	if exporting(t, standbyReg) {
		t.Fatal("both replicas export")
	}

	if err := holder.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	stopped[holder] = true
	testwait.Until(t, time.Minute, "the standby taking over", func() bool { return exporting(t, standbyReg) })
	holderReg := regA
	if holder == b {
		holderReg = regB
	}
	if got := exported(t, holderReg); len(got) != 1 || got[0] != "idemd_dbstats_exporter{} 0" {
		t.Errorf("the stopped replica still exports %q", got)
	}
}

// TestStatsQueryPlan: the counting query reads the live states' ranges of
// river_job_prioritized_fetching_index, not the table, however many
// finalized jobs River keeps.
func TestStatsQueryPlan(t *testing.T) {
	t.Parallel()
	pool := dbtest.NewPool(t)
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `
INSERT INTO river_job (state, queue, kind, args, scheduled_at, finalized_at)
SELECT 'completed', 'default', 'test_kind', '{}', now() - interval '1 hour', now()
FROM generate_series(1, 20000)`); err != nil {
		t.Fatal(err)
	}
	insertJobs(t, pool, job{"default", "available", time.Now()}, job{"mail", "running", time.Now()})
	admin, err := pgx.Connect(ctx, dbtest.AdminURL(t, pool.Config().ConnString()))
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
	if _, err := admin.Exec(ctx, "ANALYZE river_job"); err != nil {
		t.Fatal(err)
	}
	var plan []struct {
		Plan map[string]any `json:"Plan"`
	}
	var raw []byte
	if err := pool.QueryRow(ctx, "EXPLAIN (FORMAT JSON) "+riverdb.LiveJobsSQL, pgx.NamedArgs{"now": nil}).Scan(&raw); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(raw, &plan); err != nil || len(plan) != 1 {
		t.Fatalf("plan %s: %v", raw, err)
	}
	var usesIndex bool
	var walk func(n map[string]any)
	walk = func(n map[string]any) {
		if n["Node Type"] == "Seq Scan" {
			t.Errorf("the stats query scans river_job sequentially:\n%s", raw)
		}
		if n["Index Name"] == "river_job_prioritized_fetching_index" {
			cond, _ := n["Index Cond"].(string)
			usesIndex = usesIndex || strings.Contains(cond, "state")
		}
		children, _ := n["Plans"].([]any)
		for _, c := range children {
			if m, ok := c.(map[string]any); ok {
				walk(m)
			}
		}
	}
	walk(plan[0].Plan)
	if !usesIndex {
		t.Errorf("the stats query does not bound river_job_prioritized_fetching_index by state:\n%s", raw)
	}
}

// TestCountJobs: the live jobs by state, every queue together, from the
// exporter's own query; finalized jobs are not counted and a state
// without jobs is absent.
func TestCountJobs(t *testing.T) {
	t.Parallel()
	pool := dbtest.NewPool(t)
	now := time.Now()
	insertJobs(t, pool,
		job{"default", "available", now},
		job{"mail", "available", now},
		job{"default", "running", now},
		job{"mail", "pending", now},
		job{"default", "completed", now},
		job{"default", "discarded", now},
	)
	got, err := CountJobs(context.Background(), pool)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]int64{"available": 2, "running": 1, "pending": 1}
	if !maps.Equal(got, want) {
		t.Fatalf("CountJobs = %v, want %v", got, want)
	}
}

// TestLogsNameComponentOnce: the exporter runs inside the completer, whose
// logger already carries "component":"completer"; its lines say they are
// the exporter's by the logger's name, not by a second "component" key
// (a JSON object with the key twice, which log pipelines read as either).
func TestLogsNameComponentOnce(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	core := zapcore.NewCore(zapcore.NewJSONEncoder(zap.NewProductionEncoderConfig()), zapcore.AddSync(&buf), zap.InfoLevel)
	logger := zap.New(core).With(zap.String("component", "completer"))
	svc, err := New(Config{Settings: testSettings(), Pool: dbtest.NewPool(t), Registry: prometheus.NewRegistry(), Logger: logger})
	if err != nil {
		t.Fatal(err)
	}
	svc.logger.Info("a line")
	line := buf.String()
	if n := strings.Count(line, `"component"`); n != 1 {
		t.Errorf("%d \"component\" keys in %s", n, line)
	}
	if !strings.Contains(line, `"logger":"db-stats"`) {
		t.Errorf("the line does not name the exporter: %s", line)
	}
}
