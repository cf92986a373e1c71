// Package migrate applies idemd's own migrations and River's, under one
// advisory lock, so `idemctl migrate` is safe to run twice or concurrently.
package migrate

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"

	"idemd/migrations"
)

// LockKey is the advisory lock key held while migrating. It is a fixed value
// (derived from the text "idemd migrate") so that every version of the tool
// excludes every other.
const LockKey int64 = 0x6964656d646d6967 // "idemdmig"

// VersionTable is where goose records idemd's applied migrations.
const VersionTable = "idemd_schema_migrations"

// Result says what a run applied.
type Result struct {
	RiverVersions []int   // River migration versions applied in this run
	IdemdVersions []int64 // idemd migration versions applied in this run
}

// Options tune Up. The zero value is usable.
type Options struct {
	// LockTimeout bounds the wait for another migrator to finish (default 5m).
	LockTimeout time.Duration
	Logger      *slog.Logger
}

// Up applies River's migrations and then idemd's. It waits for the advisory
// lock with pg_try_advisory_lock in a loop rather than a blocking
// pg_advisory_lock: a session blocked inside pg_advisory_lock holds a
// snapshot, and idemd's CREATE INDEX CONCURRENTLY would wait for that snapshot
// while its owner waits for the lock.
func Up(ctx context.Context, pool *pgxpool.Pool, opts Options) (*Result, error) {
	if opts.LockTimeout <= 0 {
		opts.LockTimeout = 5 * time.Minute
	}
	logger := opts.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}

	// The lock lives on its own connection, outside the pool: migrators
	// waiting for it must not hold pool connections the winner needs.
	conn, err := pgx.ConnectConfig(ctx, pool.Config().ConnConfig.Copy())
	if err != nil {
		return nil, fmt.Errorf("migrate: open lock connection: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx)) //nolint:errcheck // closing also releases the lock

	if err := acquireLock(ctx, func(ctx context.Context) (bool, error) {
		var ok bool
		err := conn.QueryRow(ctx, "SELECT pg_try_advisory_lock($1)", LockKey).Scan(&ok)
		return ok, err
	}, opts.LockTimeout); err != nil {
		return nil, err
	}
	defer func() {
		// Unlock on a fresh context: the caller's may be cancelled, and a
		// leaked session lock would block the next migrator until this
		// connection closes.
		unlockCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_, _ = conn.Exec(unlockCtx, "SELECT pg_advisory_unlock($1)", LockKey)
	}()

	res := &Result{}

	migrator, err := rivermigrate.New(riverpgxv5.New(pool), &rivermigrate.Config{Logger: logger})
	if err != nil {
		return nil, fmt.Errorf("migrate: river migrator: %w", err)
	}
	riverRes, err := migrator.Migrate(ctx, rivermigrate.DirectionUp, nil)
	if err != nil {
		return nil, fmt.Errorf("migrate: river: %w", err)
	}
	for _, v := range riverRes.Versions {
		res.RiverVersions = append(res.RiverVersions, v.Version)
	}

	db := stdlib.OpenDBFromPool(pool)
	defer db.Close()
	provider, err := goose.NewProvider(goose.DialectPostgres, db, Files(),
		goose.WithTableName(VersionTable),
		goose.WithDisableGlobalRegistry(true),
		goose.WithSlog(logger),
	)
	if err != nil {
		return nil, fmt.Errorf("migrate: idemd provider: %w", err)
	}
	results, err := provider.Up(ctx)
	if err != nil {
		return nil, fmt.Errorf("migrate: idemd: %w", err)
	}
	for _, r := range results {
		res.IdemdVersions = append(res.IdemdVersions, r.Source.Version)
	}
	return res, nil
}

// Files returns the embedded idemd migrations.
func Files() fs.FS { return migrations.FS }

func acquireLock(ctx context.Context, try func(context.Context) (bool, error), timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		ok, err := try(ctx)
		if err != nil {
			return fmt.Errorf("migrate: try advisory lock: %w", err)
		}
		if ok {
			return nil
		}
		if time.Now().After(deadline) {
			return errors.New("migrate: another migration holds the lock; gave up after " + timeout.String())
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("migrate: wait for advisory lock: %w", ctx.Err())
		case <-time.After(200 * time.Millisecond):
		}
	}
}
