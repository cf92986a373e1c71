package load

import (
	"context"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemd/idemd/internal/testing/dbtest"
)

func TestMain(m *testing.M) { dbtest.Main(m) }

func TestReadProcStat(t *testing.T) {
	st, err := readProcStat(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if st.ppid != os.Getppid() || st.start == 0 {
		t.Fatalf("%+v, parent %d", st, os.Getppid())
	}
	if _, err := readProcStat(-1); !os.IsNotExist(err) {
		t.Fatalf("a missing process: %v", err)
	}
}

// TestCPUMeters: both meters see the CPU a query burns in the server.
func TestCPUMeters(t *testing.T) {
	ctx := context.Background()
	admin, err := pgxpool.New(ctx, dbtest.ServerURL(t))
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	pool := dbtest.NewPool(t)
	dbName, err := databaseName(ctx, pool)
	if err != nil {
		t.Fatal(err)
	}
	server, err := newServerCPU(ctx, admin)
	if err != nil {
		t.Skipf("the server is not on this machine: %v", err)
	}
	database := newDatabaseCPU(admin, dbName)
	for _, m := range []cpuMeter{server, database} {
		if err := m.sample(ctx); err != nil {
			t.Fatal(err)
		}
	}
	start := time.Now()
	for time.Since(start) < 300*time.Millisecond {
		if _, err := pool.Exec(ctx, `SELECT count(*) FROM generate_series(1, 300000)`); err != nil {
			t.Fatal(err)
		}
	}
	for _, m := range []cpuMeter{server, database} {
		if err := m.sample(ctx); err != nil {
			t.Fatal(err)
		}
	}
	// A query loop of 300 ms keeps its backend busy most of that time;
	// half of it is a safe floor on a machine that others share.
	if d := database.total(); d < 100*time.Millisecond || d > time.Since(start)+100*time.Millisecond {
		t.Errorf("the database's backends used %s in %s", d, time.Since(start))
	}
	if server.total() < database.total() {
		t.Errorf("the whole server (%s) used less than one database's backends (%s)", server.total(), database.total())
	}
}

func TestMerge(t *testing.T) {
	ms := func(n int) time.Duration { return time.Duration(n) * time.Millisecond }
	a := Phase{Runs: 1, Duration: time.Second, Requests: 2, Status: map[int]int{201: 2}, DBCPU: ms(10), DBCPUOK: true, WALBytes: 100, latencies: []time.Duration{ms(1), ms(3)}}
	b := Phase{Runs: 1, Duration: time.Second, Requests: 2, Status: map[int]int{201: 1, 409: 1}, DBCPU: ms(30), DBCPUOK: true, WALBytes: 300, latencies: []time.Duration{ms(2), ms(100)}}
	a.PerRun, b.PerRun = []RunFigures{{Throughput: 2}}, []RunFigures{{Throughput: 3}}
	m := merge(merge(Phase{}, a), b)
	if len(m.PerRun) != 2 || m.PerRun[0].Throughput != 2 || m.PerRun[1].Throughput != 3 {
		t.Fatalf("runs %+v", m.PerRun)
	}
	if m.Runs != 2 || m.Requests != 4 || m.Throughput != 2 || m.Status[201] != 3 || m.ConflictRate() != 0.25 {
		t.Fatalf("%+v", m)
	}
	if m.P50 != ms(2) || m.Max != ms(100) || m.CPUPerRequest() != ms(10) || m.WALPerRequest() != 100 || !m.DBCPUOK {
		t.Fatalf("p50 %s max %s cpu %s wal %f", m.P50, m.Max, m.CPUPerRequest(), m.WALPerRequest())
	}
}

// TestRoundOrder: over as many rounds as configurations, every
// configuration runs once in every position and after every other one
// once, and none runs twice in a row, across a round's end included (a-d,
// d-a put (d)'s runs side by side).
func TestRoundOrder(t *testing.T) {
	const n = 4
	var seq []int
	for r := range n {
		order := roundOrder(n, r)
		if got := slices.Sorted(slices.Values(order)); !slices.Equal(got, []int{0, 1, 2, 3}) {
			t.Fatalf("round %d runs %v", r, order)
		}
		seq = append(seq, order...)
	}
	for pos := range n {
		seen := map[int]bool{}
		for r := range n {
			seen[seq[r*n+pos]] = true
		}
		if len(seen) != n {
			t.Errorf("position %d over %d rounds holds %v", pos, n, seen)
		}
	}
	pairs := map[[2]int]int{}
	for r := range n {
		for i := 1; i < n; i++ {
			pairs[[2]int{seq[r*n+i-1], seq[r*n+i]}]++
		}
	}
	if len(pairs) != n*(n-1) {
		t.Errorf("within rounds, %d of the %d ordered pairs occur: %v", len(pairs), n*(n-1), pairs)
	}
	for i := 1; i < len(seq); i++ {
		if seq[i] == seq[i-1] {
			t.Errorf("configuration %d runs twice in a row: %v", seq[i], seq)
		}
	}
}

func TestRoundRatios(t *testing.T) {
	ms := func(n int) time.Duration { return time.Duration(n) * time.Millisecond }
	a := Phase{PerRun: []RunFigures{{90, ms(12)}, {80, ms(10)}, {100, ms(10)}}}
	b := Phase{PerRun: []RunFigures{{100, ms(10)}, {100, ms(10)}, {100, ms(10)}}}
	tp, p99 := RoundRatios(a, b)
	if !slices.Equal(tp, []float64{0.9, 0.8, 1}) || !slices.Equal(p99, []float64{1.2, 1, 1}) {
		t.Fatalf("throughput %v, p99 %v", tp, p99)
	}
	if m := Median(tp); m != 0.9 {
		t.Fatalf("median %v", m)
	}
	if m := Median([]float64{4, 1, 3, 2}); m != 2.5 {
		t.Fatalf("median of an even count %v", m)
	}
	if tp, _ := RoundRatios(a, Phase{PerRun: b.PerRun[:2]}); tp != nil {
		t.Fatalf("unequal runs paired: %v", tp)
	}
}

// TestLoadSmoke runs the benchmark in miniature (two configurations, one
// conflict size, seconds each) on a private server: the processes come up,
// every configuration is measured, jobs reach River where they should.
// Skipped with -short (it builds the binaries).
func TestLoadSmoke(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binaries and runs processes")
	}
	rep, err := Load(context.Background(), dbtest.ServerURL(t), LoadOptions{
		Duration: 6 * time.Second, Rounds: 1, Configs: []Config{ConfigA, ConfigC},
		ConflictConcurrency: []int{8}, Logf: t.Logf,
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Cost) != 2 || len(rep.Conflicts) != len(Isolations) {
		t.Fatalf("%d cost phases, %d conflict phases", len(rep.Cost), len(rep.Conflicts))
	}
	for _, ph := range append(rep.Cost, rep.Conflicts...) {
		if ph.Requests == 0 || ph.WALBytes <= 0 || (ph.DBCPUOK && ph.DBCPU <= 0) {
			t.Errorf("%s (%s): %d requests, %d WAL bytes, CPU %s", ph.Name, ph.Isolation, ph.Requests, ph.WALBytes, ph.DBCPU)
		}
	}
	a, _ := rep.Find(ConfigA.Name)
	c, _ := rep.Find(ConfigC.Name)
	if a.RiverJobs != 0 || a.Staged != 0 {
		t.Errorf("(a) created jobs: %d River, %d staged", a.RiverJobs, a.Staged)
	}
	if c.RiverJobs == 0 {
		t.Error("(c): the enqueuers moved no staged job into River")
	}
	if !a.ProcCPUOK || !c.ProcCPUOK || a.APICPU <= 0 || c.DaemonCPU <= 0 || a.DaemonCPU != 0 {
		t.Errorf("process CPU: (a) API %s, daemons %s; (c) API %s, daemons %s (ok %v %v)", a.APICPU, a.DaemonCPU, c.APICPU, c.DaemonCPU, a.ProcCPUOK, c.ProcCPUOK)
	}
	if rc := rep.Conflicts[0]; rc.Isolation != "read-committed" || rc.Status[409] != 0 {
		t.Errorf("read committed, distinct keys: %v", rc.Status)
	}
}

// TestStagingCost splits (c)'s price against (b) (IDEMD_LOAD_STAGING=1,
// about 6 minutes): the API staging with no enqueuer running (the API's
// side alone: the staged_jobs insert and its NOTIFY trigger), with the
// enqueuers polling instead of listening (no wake-up per commit), and with
// the enqueuers' Go runtime on one P, next to (b) and (c) in the same run.
func TestStagingCost(t *testing.T) {
	if os.Getenv("IDEMD_LOAD_STAGING") != "1" {
		t.Skip("set IDEMD_LOAD_STAGING=1 to split the staging hop's cost")
	}
	noEnqueuer := Config{Name: "(c0) API staging + worker, no enqueuer", ReceiptJobs: "staged", Worker: true}
	polling := ConfigC
	polling.Name, polling.EnqueuerArgs = "(cp) (c) with enqueuers --poll-only", []string{"--poll-only"}
	oneProc := ConfigC
	oneProc.Name, oneProc.EnqueuerEnv = "(c1) (c) with the enqueuers at GOMAXPROCS=1", []string{"GOMAXPROCS=1"}
	rep, err := Load(context.Background(), dbtest.ServerURL(t), LoadOptions{
		Duration: 60 * time.Second, Rounds: 4,
		Configs: []Config{ConfigB, noEnqueuer, polling, oneProc, ConfigC}, SkipConflicts: true, Logf: t.Logf,
	})
	if err != nil {
		t.Fatal(err)
	}
	b := rep.Cost[0]
	for _, ph := range rep.Cost {
		tp, p99 := Ratio(ph, b)
		t.Logf("| %s | %.0f req/s (%.2f× b) | p50 %.1f ms | p99 %.1f ms (%.2f× b) | %.2f ms DB CPU/req | %.2f ms API CPU/req | %.2f ms daemons' CPU/req | %.1f kB WAL/req | River jobs %d, staged %d |",
			ph.Name, ph.Throughput, tp, float64(ph.P50)/1e6, float64(ph.P99)/1e6, p99,
			float64(ph.CPUPerRequest())/1e6, float64(ph.APICPUPerRequest())/1e6, float64(ph.DaemonCPUPerRequest())/1e6,
			ph.WALPerRequest()/1e3, ph.RiverJobs, ph.Staged)
	}
}

// TestStagingSmoke runs the staging-throughput phase at a toy size (one
// round of 3 s at 4 clients, on the test server): every variant commits,
// and in the idemd variant every measured commit's row reached River
// exactly once (Staging fails otherwise: toRiver checks each against
// river_job).
// Skipped with -short (it builds the binaries).
func TestStagingSmoke(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binaries and runs processes")
	}
	// Every variant but the one at a raised priority, which needs root.
	variants := slices.DeleteFunc(slices.Clone(StagingVariants), func(v string) bool { return v == StagingIdemdOwnCPU })
	rep, err := Staging(context.Background(), dbtest.ServerURL(t), StagingOptions{
		Clients: []int{4}, Length: 3 * time.Second, Rounds: 1, SharedServer: true, Variants: variants, Logf: t.Logf,
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range variants {
		p, _ := rep.Find(v, 4)
		if p.Commits == 0 || p.CommitP99 <= 0 {
			t.Errorf("%s: %d commits, p99 %s", p.Variant, p.Commits, p.CommitP99)
		}
	}
	// The floor's mover copied what its clients committed, but for the
	// last few milliseconds' rows.
	if floor, _ := rep.Find(StagingFloor, 4); floor.Copied < floor.Commits {
		t.Errorf("floor: %d commits measured, %d rows copied into River", floor.Commits, floor.Copied)
	}
	if rep.IdleTransactionsPerSecond <= 0 {
		t.Errorf("idle enqueuers: %.2f transactions a second", rep.IdleTransactionsPerSecond)
	}
	idemd, _ := rep.Find(StagingIdemd, 4)
	if idemd.ToRiverP99 <= 0 || len(idemd.toRiver) != idemd.Commits {
		t.Errorf("idemd: %d commits, %d reached River, p99 %s", idemd.Commits, len(idemd.toRiver), idemd.ToRiverP99)
	}
}
