package dbtest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/idemd/idemd/internal/testing/scratchdb"
)

// Cluster is a throwaway PostgreSQL cluster owned by one test. Unlike the
// shared server of ServerURL, a test may stop and restart it (the end-to-end
// fault suite restarts PostgreSQL mid-run) without disturbing tests that run
// in parallel against the shared server.
type Cluster struct {
	bin, dir, data, opts string
	port                 int
	// settings are ClusterOptions.Settings as pg_ctl options, which a
	// standby copies.
	settings string

	mu      sync.Mutex
	running bool
}

// StartCluster initdb's and starts a cluster on a free port; it is stopped
// and removed when the test ends. It fails the test when no local initdb is
// available: the callers need a server they may restart, which neither
// TEST_DATABASE_URL nor a container gives them.
func StartCluster(tb testing.TB) *Cluster {
	tb.Helper()
	return StartClusterWith(tb, ClusterOptions{})
}

// StartClusterWith is StartCluster with options.
func StartClusterWith(tb testing.TB, o ClusterOptions) *Cluster {
	tb.Helper()
	c, err := NewClusterWith(o)
	if err != nil {
		tb.Fatalf("dbtest: start cluster: %v", err)
	}
	tb.Cleanup(c.Remove)
	return c
}

// ClusterOptions change how NewClusterWith starts a cluster.
type ClusterOptions struct {
	// Durable keeps PostgreSQL's defaults (fsync and synchronous_commit on)
	// instead of fsync off: a benchmark that measures WAL and CPU per
	// request (internal/testing/e2e/load) must pay what a real server pays.
	Durable bool
	// Settings are more server settings, "name=value" each (passed as
	// -c name=value): a benchmark sizes shared_buffers and max_wal_size as
	// a production server would. A standby made by NewStandby gets them
	// too.
	Settings []string
}

// NewCluster is StartCluster for callers without a testing.TB; the caller
// must call Remove.
func NewCluster() (*Cluster, error) {
	return NewClusterWith(ClusterOptions{})
}

// NewClusterWith is NewCluster with options.
func NewClusterWith(o ClusterOptions) (*Cluster, error) {
	bin, err := findPGBin()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "idemd-e2e-pg-")
	if err != nil {
		return nil, fmt.Errorf("temp dir: %w", err)
	}
	c := &Cluster{bin: bin, dir: dir, data: filepath.Join(dir, "data")}
	if os.Geteuid() == 0 {
		// PostgreSQL refuses to run as root: the cluster belongs to postgres.
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
	if out, err := c.command("initdb", "-D", c.data, "-U", "postgres", "-A", "trust", "--no-sync").CombinedOutput(); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("initdb: %w: %s", err, out)
	}
	if c.port, err = freePort(); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("free port: %w", err)
	}
	c.opts = fmt.Sprintf("-p %d -k %s -c listen_addresses=127.0.0.1 -c max_connections=300", c.port, dir)
	if !o.Durable {
		c.opts += " -c fsync=off"
	}
	for _, kv := range o.Settings {
		if !strings.Contains(kv, "=") || strings.ContainsAny(kv, " '\"") {
			os.RemoveAll(dir)
			return nil, fmt.Errorf("dbtest: server setting %q is not name=value", kv)
		}
		c.settings += " -c " + kv
	}
	c.opts += c.settings
	if err := c.Start(); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	if err := ping(c.URL()); err != nil {
		c.Remove()
		return nil, fmt.Errorf("ping new cluster: %w", err)
	}
	return c, nil
}

func (c *Cluster) command(name string, args ...string) *exec.Cmd {
	path := filepath.Join(c.bin, name)
	if os.Geteuid() == 0 {
		return exec.Command("runuser", append([]string{"-u", "postgres", "--", path}, args...)...)
	}
	return exec.Command(path, args...)
}

// URL is the admin URL (database "postgres") of the cluster.
func (c *Cluster) URL() string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", c.port)
}

// Port is the port the cluster listens on.
func (c *Cluster) Port() int { return c.port }

// Start starts a stopped cluster and waits until it accepts connections.
func (c *Cluster) Start() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if out, err := c.command("pg_ctl", "-D", c.data, "-o", c.opts, "-l", filepath.Join(c.dir, "log"), "-w", "start").CombinedOutput(); err != nil {
		return fmt.Errorf("pg_ctl start: %w: %s", err, out)
	}
	c.running = true
	return nil
}

// Stop stops the cluster with -m fast: sessions are terminated, as in a
// planned failover or a restart by an operator.
func (c *Cluster) Stop() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.running {
		return errors.New("dbtest: cluster is not running")
	}
	if out, err := c.command("pg_ctl", "-D", c.data, "-m", "fast", "-w", "stop").CombinedOutput(); err != nil {
		return fmt.Errorf("pg_ctl stop: %w: %s", err, out)
	}
	c.running = false
	return nil
}

// Restart is pg_ctl restart -m fast.
func (c *Cluster) Restart() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if out, err := c.command("pg_ctl", "-D", c.data, "-o", c.opts, "-l", filepath.Join(c.dir, "log"), "-m", "fast", "-w", "restart").CombinedOutput(); err != nil {
		return fmt.Errorf("pg_ctl restart: %w: %s", err, out)
	}
	c.running = true
	return nil
}

// Remove stops the cluster (immediately) and deletes its files.
func (c *Cluster) Remove() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.running {
		c.command("pg_ctl", "-D", c.data, "-m", "immediate", "-w", "stop").Run() //nolint:errcheck
		c.running = false
	}
	os.RemoveAll(c.dir)
}

// LogPath is the server log, for a failing test to show.
func (c *Cluster) LogPath() string { return filepath.Join(c.dir, "log") }

// RequirePasswords makes every role but postgres authenticate over TCP with
// scram-sha-256, as a managed PostgreSQL does, and reloads the
// configuration; postgres, the test's admin, stays trusted. pg_ctl reload
// only signals the server: the caller waits until a password-less login is
// refused before relying on it.
func (c *Cluster) RequirePasswords() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	hba := "local all all trust\n" +
		"host all postgres 127.0.0.1/32 trust\n" +
		"host all all 127.0.0.1/32 scram-sha-256\n"
	// Rewritten in place, so the file keeps its owner (postgres, when the
	// tests run as root).
	if err := os.WriteFile(filepath.Join(c.data, "pg_hba.conf"), []byte(hba), 0o600); err != nil {
		return fmt.Errorf("dbtest: write pg_hba.conf: %w", err)
	}
	if out, err := c.command("pg_ctl", "-D", c.data, "reload").CombinedOutput(); err != nil {
		return fmt.Errorf("pg_ctl reload: %w: %s", err, out)
	}
	return nil
}

// Freeze stops the postmaster and every process it started with SIGSTOP,
// as a storage stall or a paused virtual machine freezes a database: its
// sockets stay open and its kernel still completes new connections'
// handshakes and acknowledges what clients send, but nothing answers. It
// returns the thaw, which resumes them all with SIGCONT, and how many
// processes it stopped. The postmaster stops first, so it forks nothing
// while its children are listed.
func (c *Cluster) Freeze() (thaw func() error, stopped int, err error) {
	b, err := os.ReadFile(filepath.Join(c.data, "postmaster.pid"))
	if err != nil {
		return nil, 0, fmt.Errorf("dbtest: freeze: %w", err)
	}
	first, _, _ := strings.Cut(string(b), "\n")
	postmaster, err := strconv.Atoi(strings.TrimSpace(first))
	if err != nil {
		return nil, 0, fmt.Errorf("dbtest: freeze: postmaster.pid: %w", err)
	}
	var pids []int
	thaw = func() error {
		var errs []error
		// Children first: the postmaster, once running, finds them as it
		// left them.
		for i := len(pids) - 1; i >= 0; i-- {
			if err := syscall.Kill(pids[i], syscall.SIGCONT); err != nil && !errors.Is(err, syscall.ESRCH) {
				errs = append(errs, fmt.Errorf("dbtest: thaw %d: %w", pids[i], err))
			}
		}
		return errors.Join(errs...)
	}
	if err := syscall.Kill(postmaster, syscall.SIGSTOP); err != nil {
		return nil, 0, fmt.Errorf("dbtest: freeze the postmaster: %w", err)
	}
	pids = append(pids, postmaster)
	children, err := childrenOf(postmaster)
	if err != nil {
		return thaw, len(pids), errors.Join(err, thaw())
	}
	for _, pid := range children {
		if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
			if errors.Is(err, syscall.ESRCH) {
				continue // it exited since the listing
			}
			return thaw, len(pids), errors.Join(fmt.Errorf("dbtest: freeze %d: %w", pid, err), thaw())
		}
		pids = append(pids, pid)
	}
	return thaw, len(pids), nil
}

// childrenOf lists the processes whose parent is pid (Linux's /proc).
func childrenOf(pid int) ([]int, error) {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil, fmt.Errorf("dbtest: list processes: %w", err)
	}
	var out []int
	for _, e := range entries {
		child, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue // gone since the listing
		}
		// pid (comm) state ppid ...: comm may hold spaces and parentheses,
		// so the fields after it start at the last ')'.
		i := strings.LastIndexByte(string(stat), ')')
		if i < 0 {
			continue
		}
		fields := strings.Fields(string(stat[i+1:]))
		if len(fields) >= 2 && fields[1] == strconv.Itoa(pid) {
			out = append(out, child)
		}
	}
	return out, nil
}

// NewMigratedDatabase creates a database named prefix_<random> on the
// cluster, prepared as in production (deploy/sql/roles.sql applied, then
// migrated as the migrator, which grants the runtime role its
// privileges), and returns its URL as the superuser: RuntimeURL and
// MigratorURL give it as the other roles. The database goes with the
// cluster.
func (c *Cluster) NewMigratedDatabase(tb testing.TB, prefix string) string {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	dbURL, _, err := scratchdb.Create(ctx, c.URL(), prefix)
	if err != nil {
		tb.Fatal(err)
	}
	if err := ApplyRoles(ctx, dbURL); err != nil {
		tb.Fatal(err)
	}
	if err := migrateDatabase(ctx, MigratorURL(dbURL)); err != nil {
		tb.Fatalf("dbtest: migrate %s: %v", prefix, err)
	}
	return dbURL
}
