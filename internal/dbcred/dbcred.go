// Package dbcred supplies the database credentials from files that
// something else keeps current: a Vault agent, an RDS IAM or Cloud SQL token
// sidecar, or a Kubernetes Secret mounted as a volume (which the kubelet
// refreshes in place). The files are read again for every new connection,
// so rotated credentials reach the pool without a restart: connections
// already open keep the session they authenticated, and new ones, after a
// kill or at the end of pool_max_conn_lifetime, use the new content.
//
// The password file alone follows a password or token of one role. With
// the user file too, the role itself may change at each rotation (Vault's
// dynamic roles, two roles used in turn): that is what lets a rotation
// overlap, the old credentials still valid while the file changes, so
// that no new connection meets a credential the server no longer takes.
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

// File reads the password, and optionally the user, from files at each
// connection. It logs a change of the content, and a read failure, once
// each (never the password), and counts the reads that failed.
type File struct {
	path     string // the password's
	userPath string // "" keeps the URL's user
	logger   *zap.Logger
	errors   prometheus.Counter
	// readFile is os.ReadFile, replaced by tests that change a file
	// between two reads.
	readFile func(string) ([]byte, error)

	mu      sync.Mutex
	sum     [sha256.Size]byte // of the last content read, to log a change once
	read    bool              // a read has succeeded
	lastErr string            // the failure last logged, "" after a success
}

// NewFile returns a File for the password file at path and, when userPath
// is not empty, the user file there. A nil logger logs nothing.
func NewFile(path, userPath string, logger *zap.Logger) *File {
	if logger == nil {
		logger = zap.NewNop()
	}
	fields := []zap.Field{zap.String("password_file", path)}
	if userPath != "" {
		fields = append(fields, zap.String("user_file", userPath))
	}
	return &File{
		path:     path,
		userPath: userPath,
		readFile: os.ReadFile,
		logger:   logger.With(fields...),
		errors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "idemd_database_password_file_errors_total",
			Help: "Connection attempts that could not read --database-password-file or --database-user-file (missing, unreadable or empty).",
		}),
	}
}

// Collector is the counter of failed reads, for the daemon's registry.
func (f *File) Collector() prometheus.Collector { return f.errors }

// tornReads bounds how often ReadCredentials reads again a user file that
// changed under it: once is a rotation; every time is a writer gone wrong.
const tornReads = 3

// ReadCredentials returns the user ("" without a user file) and the
// password, each without its trailing line break, as a template or `echo`
// writes it. The kubelet and Vault agent replace a set of files at once
// (a directory swapped under a symlink), but two reads can still fall on
// either side of a swap: the user is read before and after the password,
// and a change between the two reads them all again, so the pair always
// comes from one version.
func (f *File) ReadCredentials() (user, password string, err error) {
	for range tornReads {
		var before, after string
		if f.userPath != "" {
			if before, err = f.readTrimmed(f.userPath, "--database-user-file"); err != nil {
				return "", "", f.failed(err)
			}
		}
		if password, err = f.readTrimmed(f.path, "--database-password-file"); err != nil {
			return "", "", f.failed(err)
		}
		if f.userPath != "" {
			if after, err = f.readTrimmed(f.userPath, "--database-user-file"); err != nil {
				return "", "", f.failed(err)
			}
		}
		if before == after {
			f.succeeded(sha256.Sum256([]byte(before + "\x00" + password)))
			return before, password, nil
		}
	}
	return "", "", f.failed(fmt.Errorf("read --database-user-file %s: it changed at each of %d reads", f.userPath, tornReads))
}

// readTrimmed reads a credential file without its trailing line break.
func (f *File) readTrimmed(path, flag string) (string, error) {
	b, err := f.readFile(path)
	if err != nil {
		return "", fmt.Errorf("read %s: %w", flag, err)
	}
	s := strings.TrimRight(string(b), "\r\n")
	if s == "" {
		// A sidecar that truncates before writing: an empty password would
		// fail authentication with a less useful message.
		return "", fmt.Errorf("read %s %s: the file is empty", flag, path)
	}
	return s, nil
}

// BeforeConnect sets the credentials of a connection about to be opened:
// pgxpool.Config.BeforeConnect, and Connect for connections outside the
// pool.
func (f *File) BeforeConnect(_ context.Context, cc *pgx.ConnConfig) error {
	user, pw, err := f.ReadCredentials()
	if err != nil {
		return err
	}
	if user != "" {
		cc.User = user
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
		f.logger.Warn("cannot read the database credentials file; new connections fail until it is readable", zap.Error(err))
	}
	return err
}

func (f *File) succeeded(sum [sha256.Size]byte) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.lastErr != "" {
		f.logger.Info("the database credentials file is readable again")
		f.lastErr = ""
	}
	if f.read && sum != f.sum {
		f.logger.Info("the database credentials file changed; new connections use the new credentials")
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
