package dbtest

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

	"github.com/testcontainers/testcontainers-go"
	"github.com/testcontainers/testcontainers-go/wait"
	"go.uber.org/goleak"
)

// startLocalCluster starts a throwaway cluster with the local initdb and
// pg_ctl on a free port. PostgreSQL refuses to run as root, so as root the
// cluster belongs to the postgres system user.
func startLocalCluster() (string, func(), error) {
	bin, err := findPGBin()
	if err != nil {
		return "", nil, err
	}
	dir, err := os.MkdirTemp("", "idemd-pg-")
	if err != nil {
		return "", nil, err
	}
	asUser := func(name string, args ...string) *exec.Cmd {
		if os.Geteuid() == 0 {
			return exec.Command("runuser", append([]string{"-u", "postgres", "--", name}, args...)...)
		}
		return exec.Command(name, args...)
	}
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			return "", nil, fmt.Errorf("running as root and no postgres user: %w", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		if err := os.Chown(dir, uid, gid); err != nil {
			return "", nil, err
		}
	}
	data := filepath.Join(dir, "data")
	if out, err := asUser(filepath.Join(bin, "initdb"), "-D", data, "-U", "postgres", "-A", "trust", "--no-sync").CombinedOutput(); err != nil {
		return "", nil, fmt.Errorf("initdb: %v: %s", err, out)
	}
	port, err := freePort()
	if err != nil {
		return "", nil, err
	}
	opts := fmt.Sprintf("-p %d -k %s -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=300", port, dir)
	if out, err := asUser(filepath.Join(bin, "pg_ctl"), "-D", data, "-o", opts, "-l", filepath.Join(dir, "log"), "-w", "start").CombinedOutput(); err != nil {
		return "", nil, fmt.Errorf("pg_ctl start: %v: %s", err, out)
	}
	stop := func() {
		asUser(filepath.Join(bin, "pg_ctl"), "-D", data, "-m", "immediate", "stop").Run() //nolint:errcheck
		os.RemoveAll(dir)
	}
	u := fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", port)
	if err := ping(u); err != nil {
		stop()
		return "", nil, err
	}
	return u, stop, nil
}

func findPGBin() (string, error) {
	if p, err := exec.LookPath("pg_ctl"); err == nil {
		return filepath.Dir(p), nil
	}
	matches, _ := filepath.Glob("/usr/lib/postgresql/*/bin/pg_ctl")
	if len(matches) == 0 {
		return "", errors.New("no initdb/pg_ctl found")
	}
	sort.Strings(matches)
	return filepath.Dir(matches[len(matches)-1]), nil
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// startContainer is the laptop fallback: a PostgreSQL container through
// testcontainers-go, when a Docker engine answers.
func startContainer() (string, func(), error) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c, err := testcontainers.GenericContainer(ctx, testcontainers.GenericContainerRequest{
		ContainerRequest: testcontainers.ContainerRequest{
			Image:        "postgres:16-alpine",
			ExposedPorts: []string{"5432/tcp"},
			Env:          map[string]string{"POSTGRES_HOST_AUTH_METHOD": "trust"},
			WaitingFor:   wait.ForListeningPort("5432/tcp").WithStartupTimeout(2 * time.Minute),
		},
		Started: true,
	})
	if err != nil {
		return "", nil, err
	}
	host, err := c.Host(ctx)
	if err != nil {
		return "", nil, err
	}
	port, err := c.MappedPort(ctx, "5432/tcp")
	if err != nil {
		return "", nil, err
	}
	u := fmt.Sprintf("postgres://postgres@%s:%s/postgres?sslmode=disable", host, port.Port())
	stop := func() { testcontainers.TerminateContainer(c) } //nolint:errcheck
	return u, stop, nil
}

func verifyNoLeaks() int {
	if err := goleak.Find(
		// testcontainers keeps one reaper connection for the whole process.
		goleak.IgnoreTopFunction("github.com/testcontainers/testcontainers-go.(*Reaper).connect.func1"),
	); err != nil {
		fmt.Fprintf(os.Stderr, "goleak: %v\n", err)
		return 1
	}
	return 0
}
