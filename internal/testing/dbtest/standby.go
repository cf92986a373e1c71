package dbtest

import (
	"fmt"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"testing"
)

// StartStandby makes a streaming standby of the running cluster c, as a
// DBA would: pg_basebackup of c with -R (standby.signal, and
// primary_conninfo pointing at c) and -X stream, started on a free port of
// its own. It is stopped and removed when the test ends (before c, whose
// cleanup was registered first). Its URL is read-only: it is in recovery.
func (c *Cluster) StartStandby(tb testing.TB) *Cluster {
	tb.Helper()
	s, err := c.NewStandby()
	if err != nil {
		tb.Fatalf("dbtest: start standby: %v", err)
	}
	tb.Cleanup(s.Remove)
	return s
}

// NewStandby is StartStandby for callers without a testing.TB (the
// benchmarks); the caller must call Remove, before removing c.
func (c *Cluster) NewStandby() (*Cluster, error) {
	dir, err := os.MkdirTemp("", "idemd-e2e-pg-standby-")
	if err != nil {
		return nil, fmt.Errorf("temp dir: %w", err)
	}
	// pg_basebackup sits beside the real pg_ctl, which the one on the
	// PATH may only be a link to.
	bin := c.bin
	if real, err := filepath.EvalSymlinks(filepath.Join(c.bin, "pg_ctl")); err == nil {
		bin = filepath.Dir(real)
	}
	s := &Cluster{bin: bin, dir: dir, data: filepath.Join(dir, "data")}
	if os.Geteuid() == 0 {
		// PostgreSQL refuses to run as root: the copy belongs to postgres.
		u, err := user.Lookup("postgres")
		if err != nil {
			os.RemoveAll(dir)
			return nil, fmt.Errorf("running as root and no postgres user: %w", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		if err := os.Chown(dir, uid, gid); err != nil {
			os.RemoveAll(dir)
			return nil, fmt.Errorf("chown %s: %w", dir, err)
		}
	}
	// The primary's default pg_hba.conf (initdb -A trust) lets local
	// replication connections in; wal_level replica and max_wal_senders
	// are PostgreSQL's defaults. --checkpoint fast: the copy starts at once
	// rather than at the next scheduled checkpoint.
	if out, err := s.command("pg_basebackup", "-h", "127.0.0.1", "-p", strconv.Itoa(c.port), "-U", "postgres",
		"-D", s.data, "-R", "-X", "stream", "--checkpoint", "fast", "--no-sync").CombinedOutput(); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("pg_basebackup: %w: %s", err, out)
	}
	if s.port, err = freePort(); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("free port: %w", err)
	}
	// The primary's options, on the standby's own port and socket
	// directory.
	s.opts = fmt.Sprintf("-p %d -k %s -c listen_addresses=127.0.0.1 -c max_connections=300 -c fsync=off", s.port, dir) + c.settings
	s.settings = c.settings
	if err := s.Start(); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	if err := ping(s.URL()); err != nil {
		s.Remove()
		return nil, fmt.Errorf("ping standby: %w", err)
	}
	return s, nil
}
