// Package migrate applies idemd's own migrations and River's, under one
// advisory lock held for the run's transaction, so `idemctl migrate` is
// safe to run twice or concurrently, directly or through any pooler.
package migrate

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"

	rolesql "github.com/idemd/idemd/deploy/sql"
	"github.com/idemd/idemd/internal/backoff"
	"github.com/idemd/idemd/internal/dbcall"
	"github.com/idemd/idemd/internal/dbcred"
	"github.com/idemd/idemd/internal/riverdb"
	"github.com/idemd/idemd/migrations"
)

// LockKey is the advisory lock key held while migrating. It is a fixed value
// (derived from the text "idemd migrate") so that every version of the tool
// excludes every other.
const LockKey int64 = 0x6964656d646d6967 // "idemdmig"

// VersionTable is where goose records idemd's applied migrations.
const VersionTable = "idemd_schema_migrations"

// Result says what a run applied.
type Result struct {
	RiverVersions []int // River migration versions applied in this run
	// RiverOwner names the role River's tables belong to when it is not
	// the migrating role's, which then applies none of River's migrations
	// (riverowner.go); "" when migrate runs River's.
	RiverOwner    string
	IdemdVersions []int64 // idemd migration versions applied in this run
	// LockRetries counts the runs that stopped on a table lock not granted
	// within DDLLockTimeout and were retried.
	LockRetries int
}

// DefaultDDLLockTimeout is Options.DDLLockTimeout's default.
const DefaultDDLLockTimeout = 2 * time.Second

// Options tune Up. The zero value is usable.
type Options struct {
	// LockWait bounds the whole wait (default 5m): for another migrator
	// to finish, and for the table locks of the migrations' statements,
	// retries included.
	LockWait time.Duration
	// DDLLockTimeout is every migration statement's lock_timeout
	// (DefaultDDLLockTimeout when zero): how long the API's statements on
	// a table may queue behind a migration's request for its lock. A
	// statement not granted its lock in time fails, and the run is retried
	// until LockWait has passed.
	DDLLockTimeout time.Duration
	// TransactionPooler says the pool goes through a transaction-mode
	// pooler, where a session setting would stay on a server connection
	// other clients then get: lock_timeout is not set (the migrator role's
	// own lock_timeout applies, docs/operations.md), and a statement that
	// times out is still retried.
	TransactionPooler bool
	Logger            *slog.Logger
	// Calls bounds the calls around the migrations (--database-timeout):
	// the lock's connection and each try for it, the reads of what is
	// applied, the grants. The migrations' own statements are not: a
	// CREATE INDEX on a large table runs as long as it needs, its lock
	// wait bounded by DDLLockTimeout and a vanished server found by the
	// connection's keepalives. nil bounds them by the default.
	Calls *dbcall.Bounds
	// Target, when positive, stops idemd's migrations at that version, as
	// an older release would (a database a release behind, for tests of an
	// upgrade); 0 applies every one this binary ships.
	Target int64
}

// Up applies River's migrations and then idemd's, then the grants on
// their tables (deploy/sql/grants.sql: the API group's, the append-only
// audit table), all holding LockKey as a
// transaction-level advisory lock in a transaction that stays open on a
// dedicated connection for the whole migration. A transaction keeps its
// server connection behind any pooler, including a transaction-mode one,
// and ends (releasing the lock) at COMMIT or when the connection dies,
// whereas a session lock's unlock could run on another server connection
// and leave it held by nobody. The lock is tried in a loop of short
// transactions rather than waited for, so migrators that wait hold neither
// a server connection nor a snapshot that idemd's CREATE INDEX CONCURRENTLY
// would wait for; the winner's open transaction holds no snapshot between
// statements (READ COMMITTED), so it does not block those either.
//
// The migrations' statements run on connections whose lock_timeout is
// DDLLockTimeout: a statement that waits for a table's lock makes every
// later request for a conflicting lock on that table, the API's writes
// included, queue behind it, so it must not wait long. One that times out
// ends the run's attempt; the next attempt, after a backoff, resumes where
// it stopped (upOnce), until LockWait has passed since Up began.
func Up(ctx context.Context, pool *pgxpool.Pool, opts Options) (*Result, error) {
	if opts.LockWait <= 0 {
		opts.LockWait = 5 * time.Minute
	}
	if opts.DDLLockTimeout <= 0 {
		opts.DDLLockTimeout = DefaultDDLLockTimeout
	}
	logger := opts.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	deadline := time.Now().Add(opts.LockWait)

	// Before anything else, the lock included: a login role that may not
	// act as idemd_migrator is refused without waiting (owner.go).
	role, err := ownerRole(ctx, pool, opts.TransactionPooler, opts.Calls)
	if err != nil {
		return nil, err
	}

	release, err := holdLock(ctx, pool, opts.LockWait, opts.Calls)
	if err != nil {
		return nil, err
	}
	defer release()

	last := &lastTimedOut{}
	ddl, err := ddlPool(ctx, pool, opts, role, last)
	if err != nil {
		return nil, err
	}
	defer ddl.Close()

	res := &Result{}
	for attempt := 1; ; attempt++ {
		err := upOnce(ctx, ddl, logger, res, opts.Calls, opts.Target)
		if err == nil {
			return res, nil
		}
		if !isLockTimeout(err) {
			return nil, err
		}
		if !time.Now().Before(deadline) {
			return nil, fmt.Errorf("migrate: a table's lock was not granted within --ddl-lock-timeout %s in %d attempts over --lock-wait %s "+
				"(a long transaction holds a lock on the table, see pg_locks); the migrations applied so far are kept, run again: %w",
				opts.DDLLockTimeout, attempt, opts.LockWait, err)
		}
		res.LockRetries++
		logger.Warn("migrate: a migration's table lock was not granted in time; the API's statements were not kept waiting behind it; retrying",
			"attempt", attempt, "ddl_lock_timeout", opts.DDLLockTimeout, "waited_in", lockWaiter(err),
			"table", last.table(), "statement", last.statement())
		wait := min(backoff.Delay(attempt, lockRetryBase, lockRetryMax, nil), time.Until(deadline))
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("migrate: wait to retry: %w", ctx.Err())
		case <-time.After(wait):
		}
	}
}

// upOnce applies what is not applied yet, adding to res. River's
// migrations each run in a transaction and idemd's either in one or, NO
// TRANSACTION, as statements that are each safe to run again, and both
// record a version only once it is applied, so after a failure a new run
// resumes where this one stopped.
func upOnce(ctx context.Context, pool *pgxpool.Pool, logger *slog.Logger, res *Result, calls *dbcall.Bounds, target int64) error {
	var river riverTables
	err := calls.Do(ctx, "migrate: read River's tables", func(ctx context.Context) (err error) {
		river, err = readRiverTables(ctx, pool)
		return err
	})
	if err != nil {
		return err
	}
	action, err := decideRiver(river)
	if err != nil {
		return err
	}
	switch action {
	case riverLeave:
		if res.RiverOwner == "" {
			leaveRiver(logger, river)
		}
		res.RiverOwner = river.owner
	case riverMigrate:
		migrator, err := rivermigrate.New(riverpgxv5.New(pool), &rivermigrate.Config{Logger: logger})
		if err != nil {
			return fmt.Errorf("migrate: river migrator: %w", err)
		}
		riverRes, err := migrator.Migrate(ctx, rivermigrate.DirectionUp, nil)
		if err != nil {
			return fmt.Errorf("migrate: river: %w", err)
		}
		for _, v := range riverRes.Versions {
			res.RiverVersions = append(res.RiverVersions, v.Version)
		}
	}

	// An index a CREATE INDEX CONCURRENTLY left INVALID (its build was
	// interrupted, by a lock timeout among others) would satisfy the
	// migration's IF NOT EXISTS and stay unusable.
	if err := dropInvalidIndexes(ctx, pool, logger); err != nil {
		return err
	}

	db := stdlib.OpenDBFromPool(pool)
	defer db.Close()
	provider, err := goose.NewProvider(goose.DialectPostgres, db, Files(),
		goose.WithTableName(VersionTable),
		goose.WithDisableGlobalRegistry(true),
		goose.WithSlog(logger),
		// A line for each migration applied, with its duration, as
		// River's migrator writes: on a large table the operator sees
		// where the time goes.
		goose.WithVerbose(true),
	)
	if err != nil {
		return fmt.Errorf("migrate: idemd provider: %w", err)
	}
	var results []*goose.MigrationResult
	if target > 0 {
		results, err = provider.UpTo(ctx, target)
	} else {
		results, err = provider.Up(ctx)
	}
	var partial *goose.PartialError
	if errors.As(err, &partial) {
		results = partial.Applied
	}
	for _, r := range results {
		res.IdemdVersions = append(res.IdemdVersions, r.Source.Version)
	}
	if err != nil {
		return fmt.Errorf("migrate: idemd: %w", err)
	}
	if err := keepRiverGINWithoutPendingList(ctx, pool, logger); err != nil {
		return err
	}
	// Every run, not only one that applied something: a database whose
	// tables were handed to the migrator, or whose grants someone changed,
	// is put right by the next migrate. Without arguments Exec sends the
	// file as one simple-protocol query, as psql -f would.
	return calls.Do(ctx, "migrate: grants", func(ctx context.Context) error {
		if _, err := pool.Exec(ctx, rolesql.Grants); err != nil {
			return fmt.Errorf("migrate: apply grants (deploy/sql/grants.sql): %w", err)
		}
		return nil
	})
}

// ddlPool is a pool for the migrations' statements: pool's settings, at
// most a few connections, each acting as role (SET ROLE, unless role is
// "": owner.go), with lock_timeout set to opts.DDLLockTimeout (unless
// opts.TransactionPooler), and last told the statement of each lock
// timeout.
func ddlPool(ctx context.Context, pool *pgxpool.Pool, opts Options, role string, last *lastTimedOut) (*pgxpool.Pool, error) {
	cfg := pool.Config().Copy()
	cfg.MaxConns = 4
	cfg.MinConns = 0
	setRoleOnConnect(cfg, role)
	cfg.ConnConfig.Tracer = &lockTimeoutTracer{prev: cfg.ConnConfig.Tracer, last: last}
	if !opts.TransactionPooler {
		prev := cfg.AfterConnect
		setting := strconv.FormatInt(opts.DDLLockTimeout.Milliseconds(), 10)
		cfg.AfterConnect = func(ctx context.Context, conn *pgx.Conn) error {
			if prev != nil {
				if err := prev(ctx, conn); err != nil {
					return err
				}
			}
			// A session setting: a direct connection, or a session-mode
			// pooler's, which resets it when the session ends.
			_, err := conn.Exec(ctx, "SELECT set_config('lock_timeout', $1, false)", setting)
			return err
		}
	}
	ddl, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("migrate: open the migrations' pool: %w", err)
	}
	return ddl, nil
}

// concurrentIndexRE finds the indexes idemd's migrations build
// CONCURRENTLY.
var concurrentIndexRE = regexp.MustCompile(`(?i)CREATE\s+(?:UNIQUE\s+)?INDEX\s+CONCURRENTLY\s+IF\s+NOT\s+EXISTS\s+(\w+)`)

// concurrentIndexes lists the indexes idemd's migrations build
// CONCURRENTLY, from the migration files themselves.
func concurrentIndexes() ([]string, error) {
	ms, err := versions()
	if err != nil {
		return nil, err
	}
	var names []string
	for _, m := range ms {
		b, err := fs.ReadFile(Files(), m.file)
		if err != nil {
			return nil, fmt.Errorf("migrate: read %s: %w", m.file, err)
		}
		for _, sub := range concurrentIndexRE.FindAllStringSubmatch(string(b), -1) {
			if !slices.Contains(names, sub[1]) {
				names = append(names, sub[1])
			}
		}
	}
	return names, nil
}

// dropInvalidIndexes drops, CONCURRENTLY, each index of concurrentIndexes
// that exists INVALID, so that the migration creating it builds it anew.
// Migrators exclude one another (LockKey), so no such build is under way.
func dropInvalidIndexes(ctx context.Context, pool *pgxpool.Pool, logger *slog.Logger) error {
	names, err := concurrentIndexes()
	if err != nil {
		return err
	}
	rows, err := pool.Query(ctx, `
SELECT c.relname FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
WHERE NOT i.indisvalid AND c.relname = ANY($1) AND pg_table_is_visible(c.oid)`, names)
	if err != nil {
		return fmt.Errorf("migrate: find invalid indexes: %w", err)
	}
	invalid, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return fmt.Errorf("migrate: find invalid indexes: %w", err)
	}
	for _, name := range invalid {
		logger.Warn("migrate: dropping an index an interrupted CREATE INDEX CONCURRENTLY left invalid; its migration builds it again", "index", name)
		if _, err := pool.Exec(ctx, "DROP INDEX CONCURRENTLY IF EXISTS "+pgx.Identifier{name}.Sanitize()); err != nil {
			return fmt.Errorf("migrate: drop invalid index %s: %w", name, err)
		}
	}
	return nil
}

// lockWaiter names, for the log, the migration whose statement timed out
// on its lock: the idemd migration file, or River's error, which names its
// version.
func lockWaiter(err error) string {
	var partial *goose.PartialError
	if errors.As(err, &partial) && partial.Failed != nil {
		return partial.Failed.Source.Path
	}
	return err.Error()
}

// lastTimedOut is the last statement that failed on a lock timeout, for the
// retry's log line.
type lastTimedOut struct {
	mu  sync.Mutex
	sql string
}

func (l *lastTimedOut) statement() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := strings.Join(strings.Fields(l.sql), " ")
	if len(s) > 200 {
		s = s[:200] + "…"
	}
	return s
}

// tableRE finds the table a DDL or DML statement names.
var tableRE = regexp.MustCompile(`(?i)\b(?:ON|TABLE|INTO|UPDATE)\s+(?:ONLY\s+)?(?:IF\s+(?:NOT\s+)?EXISTS\s+)?([\w."]+)`)

// table is the table the statement names, "" when none is found.
func (l *lastTimedOut) table() string {
	if m := tableRE.FindStringSubmatch(l.statement()); m != nil {
		return m[1]
	}
	return ""
}

// lockTimeoutTracer tells last the SQL of each statement that fails with
// lock_not_available, and passes every event on to prev.
type lockTimeoutTracer struct {
	prev pgx.QueryTracer
	last *lastTimedOut
}

type sqlKey struct{}

func (t *lockTimeoutTracer) TraceQueryStart(ctx context.Context, conn *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	if t.prev != nil {
		ctx = t.prev.TraceQueryStart(ctx, conn, data)
	}
	return context.WithValue(ctx, sqlKey{}, data.SQL)
}

func (t *lockTimeoutTracer) TraceQueryEnd(ctx context.Context, conn *pgx.Conn, data pgx.TraceQueryEndData) {
	if t.prev != nil {
		t.prev.TraceQueryEnd(ctx, conn, data)
	}
	if sql, ok := ctx.Value(sqlKey{}).(string); ok && isLockTimeout(data.Err) {
		t.last.mu.Lock()
		t.last.sql = sql
		t.last.mu.Unlock()
	}
}

// holdLock takes LockKey (see Up) and returns the function that releases
// it.
//
// The lock's connection is dialed as the pool's are (internal/dbcall: on a
// direct connection the server ends its session, releasing the lock, once
// a vanished migrator stops answering its keepalives), and opening it and
// each try for the lock are calls bounded by calls.
func holdLock(ctx context.Context, pool *pgxpool.Pool, timeout time.Duration, calls *dbcall.Bounds) (func(), error) {
	// The lock lives on its own connection, outside the pool: migrators
	// waiting for it must not hold pool connections the winner needs.
	pc := pool.Config()
	var conn *pgx.Conn
	err := calls.Do(ctx, lockOp, func(ctx context.Context) (err error) {
		if conn, err = dbcred.Connect(ctx, pc.ConnConfig, pc.BeforeConnect); err != nil {
			return fmt.Errorf("migrate: open lock connection: %w", err)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}

	var lockTx pgx.Tx
	if err := acquireLock(ctx, func(ctx context.Context) (got bool, err error) {
		err = calls.Do(ctx, lockOp, func(ctx context.Context) error {
			tx, err := conn.Begin(ctx)
			if err != nil {
				return err
			}
			// The simple protocol: an extended-protocol portal would outlive
			// the statement and keep its snapshot (and so an xmin) for the
			// whole transaction, and CREATE INDEX CONCURRENTLY waits for that.
			if err := tx.QueryRow(ctx, "SELECT pg_try_advisory_xact_lock($1)", pgx.QueryExecModeSimpleProtocol, LockKey).Scan(&got); err != nil || !got {
				_ = tx.Rollback(ctx)
				return err
			}
			lockTx = tx
			return nil
		})
		return got, err
	}, timeout); err != nil {
		cctx, cancel := calls.Cleanup(ctx)
		defer cancel()
		conn.Close(cctx) // closing also ends any transaction
		return nil, err
	}
	return func() {
		// On a fresh context: the caller's may be cancelled. If the
		// rollback fails, closing the connection ends the transaction.
		unlockCtx, cancel := calls.Cleanup(ctx)
		defer cancel()
		_ = lockTx.Rollback(unlockCtx)
		conn.Close(unlockCtx) // closing also ends the lock's transaction
	}, nil
}

// lockOp names the calls for the migrations' lock when they run out of
// their bound.
const lockOp = "migrate: lock"

// Files returns the embedded idemd migrations.
func Files() fs.FS { return migrations.FS }

// lockRetryBase and lockRetryMax bound the backoff between attempts at a
// lock another session holds (a table's lock in Up and the adoption, the
// advisory lock of a concurrent migration): the first retries come soon,
// and migrators that collided do not retry together.
const (
	lockRetryBase = 200 * time.Millisecond
	lockRetryMax  = 5 * time.Second
)

func acquireLock(ctx context.Context, try func(context.Context) (bool, error), timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for attempt := 1; ; attempt++ {
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
		case <-time.After(min(backoff.Delay(attempt, lockRetryBase, lockRetryMax, nil), time.Until(deadline))):
		}
	}
}

// PendingError lists the migrations a database lacks.
type PendingError struct {
	Idemd []string // idemd migration files not applied
	River []int    // River migration versions not applied
}

func (e *PendingError) Error() string {
	var parts []string
	if len(e.Idemd) > 0 {
		parts = append(parts, fmt.Sprintf("idemd migration %s", strings.Join(e.Idemd, ", ")))
	}
	if len(e.River) > 0 {
		vs := make([]string, len(e.River))
		for i, v := range e.River {
			vs[i] = strconv.Itoa(v)
		}
		parts = append(parts, "River migration "+strings.Join(vs, ", "))
	}
	return "the database schema is behind this binary: missing " + strings.Join(parts, " and ") + "; run `idemctl migrate`"
}

// appliedIdemdSQL lists the idemd versions whose latest goose record says
// applied (a later Down leaves a newer unapplied record).
const appliedIdemdSQL = `
SELECT version_id FROM (
    SELECT DISTINCT ON (version_id) version_id, is_applied
    FROM idemd_schema_migrations ORDER BY version_id, id DESC
) v WHERE is_applied AND version_id > 0`

// Check returns nil when the database has every idemd and River migration
// this binary was built with, and a *PendingError naming the missing ones
// otherwise: Inspect with the newest migration as the oldest schema.
func Check(ctx context.Context, pool *pgxpool.Pool) error {
	s, err := Inspect(ctx, pool, Newest())
	if err != nil {
		return err
	}
	return s.Err()
}

// Schema is where a database's schema stands against the range of idemd
// schema versions a binary runs on: from its oldest (the lowest migration
// whose objects its code needs, a constant each command states) to its
// newest (the highest migration it ships).
type Schema struct {
	Database int64    // the highest idemd migration applied (0: none)
	Oldest   int64    // the lowest version the binary runs on
	Newest   int64    // the highest version the binary ships
	Missing  []string // migration files up to Oldest that are not applied
	Unknown  []int64  // applied versions the binary does not ship: a newer release's
	River    []int    // River migrations up to the oldest of RiverSchemaVersions that are missing
}

// Err is a *PendingError when the database lacks a migration the binary
// needs, naming them and `idemctl migrate`, and nil otherwise.
func (s *Schema) Err() error {
	if len(s.Missing)+len(s.River) == 0 {
		return nil
	}
	return &PendingError{Idemd: s.Missing, River: s.River}
}

// NewerThanBinary says the database has migrations a newer release applied.
func (s *Schema) NewerThanBinary() bool { return len(s.Unknown) > 0 }

// Note says, for a database whose schema is newer than the binary, that
// this is safe, and is empty otherwise. It is safe because every idemd
// migration is additive (docs/design.md's schema contract: new tables,
// nullable or defaulted columns, indexes, triggers compatible both ways),
// so the objects an older binary uses are still there and still mean what
// they meant; that is what lets `idemctl migrate` run before a rollout and
// a rollback redeploy the previous image without touching the schema.
func (s *Schema) Note() string {
	if !s.NewerThanBinary() {
		return ""
	}
	return fmt.Sprintf("the database schema (idemd migration %d) is newer than this binary knows (up to %d): safe, idemd's migrations are additive and an older binary runs on a newer schema", s.Database, s.Newest)
}

// Inspect reads which idemd and River migrations the database has and
// compares them with the binary's range, oldest to the newest it ships.
// It changes nothing, so /readyz can ask it: a daemon started before
// `idemctl migrate` becomes ready once it has run, without a restart.
func Inspect(ctx context.Context, pool *pgxpool.Pool, oldest int64) (*Schema, error) {
	known, err := versions()
	if err != nil {
		return nil, err
	}
	s := &Schema{Oldest: oldest, Newest: known[len(known)-1].version}
	applied := map[int64]bool{}
	var exists bool
	if err := pool.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", VersionTable).Scan(&exists); err != nil {
		return nil, fmt.Errorf("check schema: %w", err)
	}
	if exists {
		rows, err := pool.Query(ctx, appliedIdemdSQL)
		if err != nil {
			return nil, fmt.Errorf("check schema: %w", err)
		}
		vs, err := pgx.CollectRows(rows, pgx.RowTo[int64])
		if err != nil {
			return nil, fmt.Errorf("check schema: %w", err)
		}
		for _, v := range vs {
			applied[v] = true
			s.Database = max(s.Database, v)
		}
	}
	ships := map[int64]bool{}
	for _, m := range known {
		ships[m.version] = true
		if m.version <= oldest && !applied[m.version] {
			s.Missing = append(s.Missing, m.file)
		}
	}
	for v := range applied {
		if !ships[v] {
			s.Unknown = append(s.Unknown, v)
		}
	}
	slices.Sort(s.Unknown)

	// River's floor is the oldest River schema the enqueuer writes
	// (RiverSchemaVersions): an API may run River one schema behind idemd's,
	// and a River newer than idemd knows is the enqueuer's gate's to judge
	// (the completer and the reaper never touch River). Where the role may
	// not read River's version (River installed by the API's role, before
	// deploy/sql/river-grants.sql ran), that is left to the gate too.
	var readable bool
	if err := pool.QueryRow(ctx, riverdb.VersionReadableSQL).Scan(&readable); err != nil {
		return nil, fmt.Errorf("migrate: check River's schema: %w", err)
	}
	if !readable {
		return s, nil
	}
	migrator, err := rivermigrate.New(riverpgxv5.New(pool), nil)
	if err != nil {
		return nil, fmt.Errorf("migrate: river migrator: %w", err)
	}
	existing, err := migrator.ExistingVersions(ctx)
	if err != nil {
		return nil, fmt.Errorf("migrate: check River's schema: %w", err)
	}
	have := map[int]bool{}
	for _, m := range existing {
		have[m.Version] = true
	}
	for _, m := range migrator.AllVersions() {
		if m.Version <= RiverSchemaVersions[0] && !have[m.Version] {
			s.River = append(s.River, m.Version)
		}
	}
	return s, nil
}

// migration is one embedded idemd migration file.
type migration struct {
	version int64
	file    string
}

// versions lists the embedded migrations in version order.
func versions() ([]migration, error) {
	files, err := fs.Glob(Files(), "*.sql")
	if err != nil {
		return nil, fmt.Errorf("migrate: list migrations: %w", err)
	}
	var ms []migration
	for _, f := range files {
		digits, _, ok := strings.Cut(f, "_")
		v, err := strconv.ParseInt(digits, 10, 64)
		if !ok || err != nil {
			continue // not a goose migration
		}
		ms = append(ms, migration{version: v, file: f})
	}
	if len(ms) == 0 {
		return nil, errors.New("migrate: the binary carries no migrations")
	}
	slices.SortFunc(ms, func(a, b migration) int { return cmp.Compare(a.version, b.version) })
	return ms, nil
}

// Newest is the highest idemd migration version the binary ships: the
// newest schema it knows.
func Newest() int64 {
	ms, err := versions()
	if err != nil {
		panic(err) // the migrations are embedded at build time
	}
	return ms[len(ms)-1].version
}

// Known says whether the binary ships idemd migration v, so that a
// command's oldest schema can be checked to name a real migration.
func Known(v int64) bool {
	ms, err := versions()
	if err != nil {
		return false
	}
	return slices.ContainsFunc(ms, func(m migration) bool { return m.version == v })
}

// keepRiverGINWithoutPendingList sets fastupdate = off on River's GIN
// indexes of river_job where it is not (migration 00020 says why), on
// every run: a River migration that rebuilds one of them brings its pending
// list back, and the next migrate removes it again. An index already off
// is not touched, so a run with nothing to do takes no lock on it; nor is
// one the role does not own (River installed by the API's role, whose
// owner may set it: docs/operations.md).
func keepRiverGINWithoutPendingList(ctx context.Context, pool *pgxpool.Pool, logger *slog.Logger) error {
	rows, err := pool.Query(ctx, riverdb.GINPendingSQL)
	if err != nil {
		return fmt.Errorf("migrate: River's GIN indexes: %w", err)
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return fmt.Errorf("migrate: River's GIN indexes: %w", err)
	}
	for _, name := range names {
		// name is the catalog's own regclass output, quoted as an
		// identifier: DDL takes no parameters.
		if _, err := pool.Exec(ctx, "ALTER INDEX "+name+" SET (fastupdate = off)"); err != nil {
			return fmt.Errorf("migrate: River's GIN index %s without a pending list: %w", name, err)
		}
		logger.Info("migrate: River's GIN index keeps no pending list (fastupdate = off)", "index", name)
	}
	return nil
}
