// Package dbcred supplies the database password (or token) from a file that
// something else keeps current: a Vault agent, an RDS IAM or Cloud SQL token
// sidecar, or a Kubernetes Secret mounted as a volume (which the kubelet
// refreshes in place). The file is read again for every new connection, so
// a rotated password reaches the pool without a restart: connections
// already open keep the session they authenticated, and new ones, after a
// kill or at the end of pool_max_conn_lifetime, use the new content.
package dbcred

import (
	"context"
	"crypto/sha256"
	"fmt"
	"os"
	"strings"
	"sync"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
)

// File reads the password from a path at each connection. It logs a
// change of the content, and a read failure, once each (never the
// content), and counts the reads that failed.
type File struct {
	path   string
	logger *zap.Logger
	errors prometheus.Counter

	mu      sync.Mutex
	sum     [sha256.Size]byte // of the last content read, to log a change once
	read    bool              // a read has succeeded
	lastErr string            // the failure last logged, "" after a success
}

// NewFile returns a File for path. A nil logger logs nothing.
func NewFile(path string, logger *zap.Logger) *File {
	if logger == nil {
		logger = zap.NewNop()
	}
	return &File{
		path:   path,
		logger: logger.With(zap.String("password_file", path)),
		errors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "idemd_database_password_file_errors_total",
			Help: "Connection attempts that could not read --database-password-file (missing, unreadable or empty).",
		}),
	}
}

// Collector is the counter of failed reads, for the daemon's registry.
func (f *File) Collector() prometheus.Collector { return f.errors }

// Read returns the file's content without its trailing line break, as a
// template or `echo` writes it.
func (f *File) Read() (string, error) {
	b, err := os.ReadFile(f.path)
	if err != nil {
		return "", f.failed(fmt.Errorf("read --database-password-file: %w", err))
	}
	pw := strings.TrimRight(string(b), "\r\n")
	if pw == "" {
		// A sidecar that truncates before writing: an empty password would
		// fail authentication with a less useful message.
		return "", f.failed(fmt.Errorf("read --database-password-file %s: the file is empty", f.path))
	}
	f.succeeded(sha256.Sum256([]byte(pw)))
	return pw, nil
}

// BeforeConnect sets the password of a connection about to be opened:
// pgxpool.Config.BeforeConnect, and Connect for connections outside the
// pool.
func (f *File) BeforeConnect(_ context.Context, cc *pgx.ConnConfig) error {
	pw, err := f.Read()
	if err != nil {
		return err
	}
	cc.Password = pw
	return nil
}

func (f *File) failed(err error) error {
	f.errors.Inc()
	f.mu.Lock()
	defer f.mu.Unlock()
	if msg := err.Error(); msg != f.lastErr {
		f.lastErr = msg
		f.logger.Warn("cannot read the database password file; new connections fail until it is readable", zap.Error(err))
	}
	return err
}

func (f *File) succeeded(sum [sha256.Size]byte) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.lastErr != "" {
		f.logger.Info("the database password file is readable again")
		f.lastErr = ""
	}
	if f.read && sum != f.sum {
		f.logger.Info("the database password file changed; new connections use the new password")
	}
	f.sum, f.read = sum, true
}

// Connect opens one connection outside a pool (a LISTEN session, a lock
// held for a whole run) with a copy of cc, after before, the pool's
// BeforeConnect when it has one, so that it authenticates with the
// credentials the pool's next connection would use.
func Connect(ctx context.Context, cc *pgx.ConnConfig, before func(context.Context, *pgx.ConnConfig) error) (*pgx.Conn, error) {
	cc = cc.Copy()
	if before != nil {
		if err := before(ctx, cc); err != nil {
			return nil, fmt.Errorf("connect: %w", err)
		}
	}
	conn, err := pgx.ConnectConfig(ctx, cc)
	if err != nil {
		return nil, fmt.Errorf("connect: %w", err)
	}
	return conn, nil
}
