package soak

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemd/idemd/internal/testing/e2e/alertcheck"
	"github.com/idemd/idemd/internal/testing/e2e/system"
)

// Tables are the tables the soak watches: the API's keys and idemd's two
// queues.
var Tables = []string{"idempotency_keys", "staged_jobs", "river_job"}

// AppNames are the application_names whose connections are counted, each
// in its own column; the others are summed as "other". rocketrides is the
// API's (the soak sets it in the API's URL: its default, idemd-rocketrides,
// would count as idemd's).
var AppNames = []string{"idemd-enqueuer", "idemd-enqueuer-listener", "idemd-completer", "idemd-reaper", apiAppName}

const (
	apiAppName     = "rocketrides"
	samplerAppName = "soak-sampler"
	otherApps      = "other"
)

// Sample is what the soak reads every interval.
type Sample struct {
	// At is the time since the traffic started.
	At time.Duration
	// Procs by process name (enqueuer-1, ..., rocketrides).
	Procs map[string]ProcSample
	// Conns are pg_stat_activity's client sessions of the database by
	// application_name (AppNames, and "other"); autovacuum's workers are
	// not among them.
	Conns map[string]int
	// APIResponses is rocketrides_http_responses_total (every status, the
	// completer's replays included); APIRate its rate since the previous
	// sample.
	APIResponses, APIRate float64
	// Client side, since the previous sample: responses the simulator's
	// clients got and their p50 and p99.
	ClientResponses      int
	ClientP50, ClientP99 time.Duration
	Tables               map[string]TableSample
	Indexes              map[string]int64 // size in bytes by index name
	// XID is the next transaction id (pg_current_snapshot's xmax); XIDRate
	// the transactions per second since the previous sample.
	XID     int64
	XIDRate float64
	Horizon Horizon
	// Staged rows in staged_jobs and the oldest one's age.
	Staged       int64
	StagedOldest time.Duration
	// OpenKeys are keys not finished; Reviews the keys flagged so far.
	OpenKeys, Reviews int64
	// RiverPending are River jobs not yet worked (available, running,
	// retryable, scheduled): the API's receipt worker's backlog.
	RiverPending int64
	// ReaperDeleted is idemd_reaper_keys_deleted_total.
	ReaperDeleted float64
}

// ProcSample is one process's memory and goroutines.
type ProcSample struct {
	RSS        int64 // bytes, /proc/<pid>/status VmRSS
	Goroutines int   // go_goroutines; -1 when its /metrics did not answer
}

// TableSample is one table's size and pg_stat_user_tables counters.
type TableSample struct {
	Heap, Total               int64 // pg_relation_size, pg_total_relation_size
	Live, Dead                int64
	Autovacuums, Autoanalyzes int64
	LastAutovacuum            time.Time
	Vacuums                   int64
}

// Horizon is the database's xmin horizon: the oldest of the sessions'
// backend_xmin, the replication slots' xmin and the prepared transactions.
type Horizon struct {
	// Age in transactions of the oldest, and who holds it
	// (application_name or backend type; "slot <name>", "prepared <gid>").
	Age    int64
	Holder string
	// HeldFor is how long its holder has been in its transaction (now -
	// xact_start; for a slot, 0), a bound on how long it has held it.
	HeldFor time.Duration
	// Slot and Prepared are the ages of the oldest replication slot xmin
	// and prepared transaction (0: none).
	Slot, Prepared int64
}

// Seconds is the horizon's age in seconds' worth of transactions at rate
// (xacts/s); 0 when no rate is known.
func (h Horizon) Seconds(rate float64) float64 {
	if rate <= 0 {
		return 0
	}
	return float64(h.Age) / rate
}

// sampler reads a Sample.
type sampler struct {
	admin   *pgxpool.Pool // the soak's own sessions (samplerAppName)
	procs   []*system.Proc
	api     *system.RocketRides
	reaper  *system.Proc
	clients *recorder
	prev    *Sample
	start   time.Time
}

// indexNames lists the watched tables' indexes, fixed for the run's
// columns.
func indexNames(ctx context.Context, admin *pgxpool.Pool) ([]string, error) {
	rows, err := admin.Query(ctx, `SELECT indexrelname FROM pg_stat_user_indexes WHERE relname = ANY($1) ORDER BY relname, indexrelname`, Tables)
	if err != nil {
		return nil, fmt.Errorf("soak: indexes: %w", err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var n string
		if err := rows.Scan(&n); err != nil {
			return nil, fmt.Errorf("soak: indexes: %w", err)
		}
		out = append(out, n)
	}
	return out, rows.Err()
}

func (s *sampler) sample(ctx context.Context) (Sample, error) {
	now := time.Now()
	smp := Sample{At: now.Sub(s.start), Procs: map[string]ProcSample{}, Conns: map[string]int{}, Tables: map[string]TableSample{}, Indexes: map[string]int64{}}
	for _, p := range append(append([]*system.Proc(nil), s.procs...), s.api.Proc) {
		ps := ProcSample{Goroutines: -1}
		if pid := p.Pid(); pid != 0 {
			rss, err := vmRSS(pid)
			if err != nil {
				return smp, err
			}
			ps.RSS = rss
		}
		if samples, err := metrics(ctx, p); err == nil {
			ps.Goroutines = int(value(samples, "go_goroutines", nil))
			if p == s.api.Proc {
				smp.APIResponses = sum(samples, "rocketrides_http_responses_total")
			}
			if p == s.reaper {
				smp.ReaperDeleted = value(samples, "idemd_reaper_keys_deleted_total", nil)
			}
		}
		smp.Procs[p.Name] = ps
	}
	smp.ClientResponses, smp.ClientP50, smp.ClientP99 = s.clients.window()
	if err := s.database(ctx, &smp); err != nil {
		return smp, err
	}
	if s.prev != nil {
		dt := (smp.At - s.prev.At).Seconds()
		if dt > 0 {
			smp.APIRate = (smp.APIResponses - s.prev.APIResponses) / dt
			smp.XIDRate = float64(smp.XID-s.prev.XID) / dt
		}
	}
	s.prev = &smp
	return smp, nil
}

// database reads the sample's database figures.
func (s *sampler) database(ctx context.Context, smp *Sample) error {
	rows, err := s.admin.Query(ctx, `
SELECT CASE WHEN application_name = ANY($1) THEN application_name ELSE $2 END, count(*)
FROM pg_stat_activity WHERE datname = current_database() AND backend_type = 'client backend' AND pid <> pg_backend_pid() AND application_name <> $3
GROUP BY 1`, AppNames, otherApps, samplerAppName)
	if err != nil {
		return fmt.Errorf("soak: connections: %w", err)
	}
	for rows.Next() {
		var app string
		var n int
		if err := rows.Scan(&app, &n); err != nil {
			rows.Close()
			return fmt.Errorf("soak: connections: %w", err)
		}
		smp.Conns[app] += n
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("soak: connections: %w", err)
	}
	rows, err = s.admin.Query(ctx, `
SELECT s.relname, pg_relation_size(s.relid), pg_total_relation_size(s.relid), s.n_live_tup, s.n_dead_tup,
       s.autovacuum_count, s.autoanalyze_count, s.vacuum_count, coalesce(s.last_autovacuum, 'epoch')
FROM pg_stat_user_tables s WHERE s.relname = ANY($1)`, Tables)
	if err != nil {
		return fmt.Errorf("soak: tables: %w", err)
	}
	for rows.Next() {
		var name string
		var t TableSample
		if err := rows.Scan(&name, &t.Heap, &t.Total, &t.Live, &t.Dead, &t.Autovacuums, &t.Autoanalyzes, &t.Vacuums, &t.LastAutovacuum); err != nil {
			rows.Close()
			return fmt.Errorf("soak: tables: %w", err)
		}
		smp.Tables[name] = t
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("soak: tables: %w", err)
	}
	rows, err = s.admin.Query(ctx, `SELECT indexrelname, pg_relation_size(indexrelid) FROM pg_stat_user_indexes WHERE relname = ANY($1)`, Tables)
	if err != nil {
		return fmt.Errorf("soak: indexes: %w", err)
	}
	for rows.Next() {
		var name string
		var size int64
		if err := rows.Scan(&name, &size); err != nil {
			rows.Close()
			return fmt.Errorf("soak: indexes: %w", err)
		}
		smp.Indexes[name] = size
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("soak: indexes: %w", err)
	}
	var oldest float64
	if err := s.admin.QueryRow(ctx, `
SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint,
       (SELECT count(*) FROM staged_jobs),
       coalesce((SELECT extract(epoch FROM now() - min(created_at)) FROM staged_jobs), 0)::float8,
       (SELECT count(*) FROM idempotency_keys WHERE recovery_point <> 'finished'),
       (SELECT count(*) FROM idempotency_key_reviews),
       (SELECT count(*) FROM river_job WHERE state IN ('available', 'running', 'retryable', 'scheduled'))`).Scan(&smp.XID, &smp.Staged, &oldest, &smp.OpenKeys, &smp.Reviews, &smp.RiverPending); err != nil {
		return fmt.Errorf("soak: counts: %w", err)
	}
	smp.StagedOldest = time.Duration(oldest * float64(time.Second))
	h, err := readHorizon(ctx, s.admin)
	if err != nil {
		return err
	}
	smp.Horizon = h
	return nil
}

// horizonSQL finds the oldest xmin that holds back vacuum in this cluster:
// sessions' backend_xmin (all databases: a private cluster has only the
// soak's), replication slots' xmin and catalog_xmin, prepared
// transactions. Left out: this session, and autovacuum's VACUUMs, whose
// xmin other vacuums ignore (PROC_IN_VACUUM).
const horizonSQL = `
WITH held AS (
    SELECT age(backend_xmin) AS age,
           coalesce(nullif(application_name, ''), backend_type) AS holder,
           coalesce(extract(epoch FROM now() - xact_start), 0)::float8 AS held_for
    FROM pg_stat_activity
    WHERE backend_xmin IS NOT NULL AND pid <> pg_backend_pid()
      AND NOT (backend_type = 'autovacuum worker' AND query LIKE 'autovacuum: VACUUM%')
    UNION ALL
    SELECT greatest(age(xmin), age(catalog_xmin)), 'slot ' || slot_name, 0 FROM pg_replication_slots
    WHERE xmin IS NOT NULL OR catalog_xmin IS NOT NULL
    UNION ALL
    SELECT age(transaction), 'prepared ' || gid, extract(epoch FROM now() - prepared)::float8 FROM pg_prepared_xacts
)
SELECT coalesce((SELECT age FROM held ORDER BY age DESC LIMIT 1), 0),
       coalesce((SELECT holder FROM held ORDER BY age DESC LIMIT 1), ''),
       coalesce((SELECT held_for FROM held ORDER BY age DESC LIMIT 1), 0),
       coalesce((SELECT max(greatest(age(xmin), age(catalog_xmin))) FROM pg_replication_slots), 0),
       coalesce((SELECT max(age(transaction)) FROM pg_prepared_xacts), 0)`

func readHorizon(ctx context.Context, admin *pgxpool.Pool) (Horizon, error) {
	var h Horizon
	var heldFor float64
	if err := admin.QueryRow(ctx, horizonSQL).Scan(&h.Age, &h.Holder, &heldFor, &h.Slot, &h.Prepared); err != nil {
		return h, fmt.Errorf("soak: xmin horizon: %w", err)
	}
	h.HeldFor = time.Duration(heldFor * float64(time.Second))
	return h, nil
}

// vmRSS reads a process's resident set from /proc/<pid>/status.
func vmRSS(pid int) (int64, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0, fmt.Errorf("soak: rss: %w", err)
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		rest, ok := strings.CutPrefix(sc.Text(), "VmRSS:")
		if !ok {
			continue
		}
		f := strings.Fields(rest)
		if len(f) != 2 || f[1] != "kB" {
			break
		}
		kb, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil {
			break
		}
		return kb << 10, nil
	}
	return 0, fmt.Errorf("soak: rss: no VmRSS in /proc/%d/status", pid)
}

func metrics(ctx context.Context, p *system.Proc) ([]alertcheck.Sample, error) {
	page, err := p.Metrics(ctx)
	if err != nil {
		return nil, err
	}
	return alertcheck.ParseText(bytes.NewReader(page))
}

// value is the first series named name carrying every label of labels.
func value(samples []alertcheck.Sample, name string, labels map[string]string) float64 {
	for _, s := range samples {
		if s.Name != name {
			continue
		}
		match := true
		for k, v := range labels {
			match = match && s.Labels[k] == v
		}
		if match {
			return s.Value
		}
	}
	return 0
}

// sum adds up every series named name.
func sum(samples []alertcheck.Sample, name string) float64 {
	var t float64
	for _, s := range samples {
		if s.Name == name {
			t += s.Value
		}
	}
	return t
}
