package load

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
)

// Server is a private PostgreSQL cluster for one load run: every
// configuration runs on it, and nothing else does, so its processes' CPU
// and its WAL are the run's alone even on a machine whose shared server is
// busy with other work. It keeps PostgreSQL's defaults (fsync and
// synchronous_commit on, shared_buffers 128 MB), the settings of the
// machine's shared server, but for max_connections (300, for the 32-client
// runs and the daemons).
type Server struct {
	bin, dir, data string
	port           int
}

// StartServer initdb's and starts a cluster on a free port, as the postgres
// system user when run as root (PostgreSQL refuses root). The caller must
// Stop it.
func StartServer(ctx context.Context) (*Server, error) {
	bin, err := pgBin()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "idemd-load-pg-")
	if err != nil {
		return nil, fmt.Errorf("load: server: %w", err)
	}
	s := &Server{bin: bin, dir: dir, data: filepath.Join(dir, "data")}
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			os.RemoveAll(dir)
			return nil, fmt.Errorf("load: server: running as root and no postgres user: %w", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		if err := os.Chown(dir, uid, gid); err != nil {
			os.RemoveAll(dir)
			return nil, fmt.Errorf("load: server: %w", err)
		}
	}
	if out, err := s.command(ctx, "initdb", "-D", s.data, "-U", "postgres", "-A", "trust", "--no-sync").CombinedOutput(); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("load: initdb: %w: %s", err, out)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("load: server: free port: %w", err)
	}
	s.port = l.Addr().(*net.TCPAddr).Port
	l.Close()
	opts := fmt.Sprintf("-p %d -k %s -c listen_addresses=127.0.0.1 -c max_connections=300", s.port, dir)
	if out, err := s.command(ctx, "pg_ctl", "-D", s.data, "-o", opts, "-l", filepath.Join(dir, "log"), "-w", "start").CombinedOutput(); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("load: pg_ctl start: %w: %s", err, out)
	}
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for {
		conn, err := pgx.Connect(wctx, s.URL())
		if err == nil {
			conn.Close(wctx)
			return s, nil
		}
		if wctx.Err() != nil {
			s.Stop()
			return nil, fmt.Errorf("load: server does not answer: %w", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// URL is the cluster's admin URL.
func (s *Server) URL() string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", s.port)
}

// Stop stops the cluster and deletes its files.
func (s *Server) Stop() {
	s.command(context.Background(), "pg_ctl", "-D", s.data, "-m", "immediate", "-w", "stop").Run() //nolint:errcheck
	os.RemoveAll(s.dir)
}

func (s *Server) command(ctx context.Context, name string, args ...string) *exec.Cmd {
	path := filepath.Join(s.bin, name)
	if os.Geteuid() == 0 {
		return exec.CommandContext(ctx, "runuser", append([]string{"-u", "postgres", "--", path}, args...)...)
	}
	return exec.CommandContext(ctx, path, args...)
}

func pgBin() (string, error) {
	if p, err := exec.LookPath("pg_ctl"); err == nil {
		return filepath.Dir(p), nil
	}
	matches, _ := filepath.Glob("/usr/lib/postgresql/*/bin/pg_ctl")
	if len(matches) == 0 {
		return "", errors.New("load: no initdb/pg_ctl found")
	}
	sort.Strings(matches)
	return filepath.Dir(matches[len(matches)-1]), nil
}
