package load

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemd/idemd/internal/testing/e2e/system"
)

// clockTick is Linux's USER_HZ, the unit of /proc/<pid>/stat's CPU times
// (100 on every architecture Go and PostgreSQL run on here).
const clockTick = 10 * time.Millisecond

// cpuMeter measures the database server's CPU time between its first and
// its last sample. Both kinds need the server on this machine.
type cpuMeter interface {
	sample(ctx context.Context) error
	total() time.Duration
}

// serverCPU is the CPU time of a whole private cluster (dbtest.Cluster): the
// postmaster, every process it started (backends, autovacuum, the WAL
// writer, checkpointer, background writer) and, through the postmaster's
// cutime and cstime, those that exited since: exact at any two samples.
type serverCPU struct {
	postmaster  int
	first, last uint64
	sampled     bool
}

// newServerCPU finds the postmaster as the parent of one of its backends.
func newServerCPU(ctx context.Context, admin *pgxpool.Pool) (*serverCPU, error) {
	var pid int
	if err := admin.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
		return nil, fmt.Errorf("cpu: backend pid: %w", err)
	}
	st, err := readProcStat(pid)
	if err != nil {
		return nil, err
	}
	return &serverCPU{postmaster: st.ppid}, nil
}

func (m *serverCPU) sample(context.Context) error {
	pm, err := readProcStat(m.postmaster)
	if err != nil {
		return err
	}
	ticks := pm.utime + pm.stime + pm.cutime + pm.cstime
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return fmt.Errorf("cpu: %w", err)
	}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		st, err := readProcStat(pid)
		if err != nil || st.ppid != m.postmaster {
			continue // gone, or not the server's
		}
		ticks += st.utime + st.stime
	}
	if !m.sampled {
		m.first, m.sampled = ticks, true
	}
	m.last = ticks
	return nil
}

func (m *serverCPU) total() time.Duration { return time.Duration(m.last-m.first) * clockTick }

// databaseCPU, for a shared server, adds up the CPU time of the server
// processes connected to one database: every sample lists them
// (pg_stat_activity, through the admin pool's connection to another
// database, so the meter does not measure itself) and reads their utime and
// stime. A process counts from its first sample (or from zero when it
// started after the first sample), so a backend that exits between two
// samples loses what it used since the last one; the server's own
// processes (WAL writer, checkpointer) are not counted.
type databaseCPU struct {
	admin  *pgxpool.Pool
	dbName string
	first  bool
	procs  map[procID]*procCPU
}

// procID tells a process from a later one with the same pid.
type procID struct {
	pid   int
	start uint64 // starttime, in clock ticks since boot
}

type procCPU struct{ base, last uint64 }

func newDatabaseCPU(admin *pgxpool.Pool, dbName string) *databaseCPU {
	return &databaseCPU{admin: admin, dbName: dbName, first: true, procs: map[procID]*procCPU{}}
}

func (m *databaseCPU) sample(ctx context.Context) error {
	rows, err := m.admin.Query(ctx, `SELECT pid FROM pg_stat_activity WHERE datname = $1`, m.dbName)
	if err != nil {
		return fmt.Errorf("cpu: backends: %w", err)
	}
	var pids []int
	for rows.Next() {
		var pid int
		if err := rows.Scan(&pid); err != nil {
			rows.Close()
			return fmt.Errorf("cpu: backends: %w", err)
		}
		pids = append(pids, pid)
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("cpu: backends: %w", err)
	}
	first := m.first
	m.first = false
	var lastErr error
	for _, pid := range pids {
		st, err := readProcStat(pid)
		if err != nil {
			if !os.IsNotExist(err) { // gone since the listing: its last sample stands
				lastErr = err
			}
			continue
		}
		id, ticks := procID{pid: pid, start: st.start}, st.utime+st.stime
		p, ok := m.procs[id]
		if !ok {
			p = &procCPU{}
			if first {
				p.base = ticks
			}
			m.procs[id] = p
		}
		p.last = ticks
	}
	return lastErr
}

// total is the CPU time used between the first sample and the last.
func (m *databaseCPU) total() time.Duration {
	var ticks uint64
	for _, p := range m.procs {
		ticks += p.last - p.base
	}
	return time.Duration(ticks) * clockTick
}

// procStat is what the meters read of /proc/<pid>/stat, in clock ticks.
type procStat struct {
	ppid                         int
	utime, stime, cutime, cstime uint64
	start                        uint64
}

func readProcStat(pid int) (procStat, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return procStat{}, err
	}
	// The command name (field 2) is in parentheses and may hold spaces;
	// the fields after its closing parenthesis start with field 3.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return procStat{}, fmt.Errorf("cpu: /proc/%d/stat: unexpected format", pid)
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 20 {
		return procStat{}, fmt.Errorf("cpu: /proc/%d/stat: unexpected format", pid)
	}
	var st procStat
	var bad bool
	num := func(field int) uint64 {
		n, err := strconv.ParseUint(f[field-3], 10, 64)
		bad = bad || err != nil
		return n
	}
	st.ppid = int(num(4))
	st.utime, st.stime, st.cutime, st.cstime = num(14), num(15), num(16), num(17)
	st.start = num(22)
	if bad {
		return procStat{}, fmt.Errorf("cpu: /proc/%d/stat: unexpected format", pid)
	}
	return st, nil
}

// databaseName is the name of the database pool is connected to.
func databaseName(ctx context.Context, pool *pgxpool.Pool) (string, error) {
	var name string
	if err := pool.QueryRow(ctx, `SELECT current_database()`).Scan(&name); err != nil {
		return "", fmt.Errorf("load: database name: %w", err)
	}
	return name, nil
}

// walLSN is the server's WAL insert position.
func walLSN(ctx context.Context, pool *pgxpool.Pool) (string, error) {
	var lsn string
	err := pool.QueryRow(ctx, `SELECT pg_current_wal_insert_lsn()::text`).Scan(&lsn)
	return lsn, err
}

// walSince is how many bytes of WAL the server wrote since lsn.
func walSince(ctx context.Context, pool *pgxpool.Pool, lsn string) (int64, error) {
	var n int64
	err := pool.QueryRow(ctx, `SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), $1::pg_lsn)::bigint`, lsn).Scan(&n)
	return n, err
}

// withParam returns the connection URL u with the query parameter k=v.
func withParam(u, k, v string) (string, error) {
	parsed, err := url.Parse(u)
	if err != nil {
		return "", fmt.Errorf("load: database URL: %w", err)
	}
	q := parsed.Query()
	q.Set(k, v)
	parsed.RawQuery = q.Encode()
	return parsed.String(), nil
}

// procMeter reads the CPU time the API's process and the daemons' have
// used so far. A process restarted during the window would be measured
// wrongly; run fails on any restart.
type procMeter struct {
	api     *system.Proc
	daemons []*system.Proc
}

func (m procMeter) sample() (api, daemons time.Duration, err error) {
	read := func(p *system.Proc) (time.Duration, error) {
		pid := p.Pid()
		if pid == 0 {
			return 0, fmt.Errorf("cpu: %s is not running", p.Name)
		}
		st, err := readProcStat(pid)
		if err != nil {
			return 0, err
		}
		return time.Duration(st.utime+st.stime) * clockTick, nil
	}
	if api, err = read(m.api); err != nil {
		return 0, 0, err
	}
	for _, p := range m.daemons {
		d, err := read(p)
		if err != nil {
			return 0, 0, err
		}
		daemons += d
	}
	return api, daemons, nil
}
