package enqueuer

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/riverqueue/river"
	"go.uber.org/zap"
)

// A refusal is a failed batch whose cause no retry heals: River's table
// wrote fewer jobs than the batch took rows (a trigger or rule dropping
// inserts), refused a job any valid row would be refused for (a column,
// constraint or trigger added to river_job by hand), or the enqueuer's
// role may not read or write a table, or a table it writes is missing.
// None of it is a row's fault: the batch rolls back whole, every row
// stays staged, nothing is dead-lettered. Unlike a lost connection, it
// holds until someone acts, so the first batch it fails says so at once:
// /readyz fails naming the cause and the fix, idemd_enqueuer_move_refused
// is 1, the cause is counted in idemd_enqueuer_move_refusals_total and
// logged once when it starts and once when it ends (a committed batch
// that took the refused batch's rows).

// Refusal causes: the values of the refusals metric's cause label.
const (
	RefusalJobsDropped     = "jobs_dropped"
	RefusalTableRefused    = "table_refused"
	RefusalPermission      = "permission_denied"
	RefusalRelationMissing = "relation_missing"
)

// RefusalCauses lists every cause above; the metric's series start at 0
// from it.
var RefusalCauses = []string{RefusalJobsDropped, RefusalTableRefused, RefusalPermission, RefusalRelationMissing}

// errJobsDropped: the insert into River wrote fewer jobs than it was
// given rows (the SQL path's idemd_move_check raises the same).
var errJobsDropped = errors.New("River's table wrote fewer jobs than staged rows taken")

// errTableRefused: River's table refused a job for a reason of the
// table's, not the row's.
var errTableRefused = errors.New("River's table refuses valid jobs")

// moveCheckMessage starts the message idemd_move_check (migration 00021)
// raises when the SQL path wrote fewer jobs than it took rows.
const moveCheckMessage = "idemd move:"

// refusal is a classified refusal.
type refusal struct {
	cause string // one of RefusalCauses
	fix   string
}

// classifyRefusal returns the refusal err is, or nil when a retry may
// succeed (or it is not the move's to judge: River's schema version has
// its own gate, riverschema.go).
func classifyRefusal(err error) *refusal {
	if err == nil || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return nil
	}
	switch {
	case errors.Is(err, errJobsDropped):
		return &refusal{RefusalJobsDropped, dropFix}
	case errors.Is(err, errTableRefused):
		return &refusal{RefusalTableRefused, "undo the change to river_job that refuses valid jobs " +
			"(a NOT NULL column without a default, a CHECK or foreign-key constraint, a trigger added by hand)"}
	}
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return nil
	}
	switch pgErr.Code {
	case "P0001":
		if strings.HasPrefix(pgErr.Message, moveCheckMessage) {
			return &refusal{RefusalJobsDropped, dropFix}
		}
	case "42501": // insufficient_privilege
		if strings.Contains(pgErr.Message, "river_") {
			return &refusal{RefusalPermission, "run deploy/sql/river-grants.sql as River's owner " +
				"(docs/operations.md, \"River installed by the API\")"}
		}
		return &refusal{RefusalPermission, "run `idemctl migrate` as idemd_migrator, which applies deploy/sql/grants.sql, " +
			"and connect as idemd_runtime (docs/operations.md, \"Database roles\")"}
	case "42P01", "42703", "42704", "42883": // undefined table, column, object, function
		return &refusal{RefusalRelationMissing, "run `idemctl migrate` (it applies River's migrations too, " +
			"where idemd owns River); where the API's role installed River, run River's migrations there"}
	}
	return nil
}

const dropFix = "a trigger or rule on river_job drops inserts (BEFORE INSERT ... RETURN NULL, DO INSTEAD NOTHING): " +
	"drop it; the rows stay in staged_jobs meanwhile"

// refusalState is the refusal the last batch failed with, if any.
type refusalState struct {
	mu      sync.Mutex
	current *refusal
	err     string // the batch's error, for /readyz
	// from is where the refused batch started taking rows: a batch that
	// commits from there or below has taken what it could not (or found
	// it gone). Another worker's batch further on proves nothing about it.
	from int64
}

// blocked is /readyz's view: why the enqueuer moves nothing, River's
// schema gate first.
func (s *Service) blocked() error {
	if err := s.riverGate.blocked(); err != nil {
		return err
	}
	r := &s.refusals
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.current == nil {
		return nil
	}
	return fmt.Errorf("moves refused (%s): %s; fix: %s", r.current.cause, r.err, r.current.fix)
}

// batchFailed records the error of a batch that took rows from id from
// (math.MaxInt64: it failed before taking any) when it is a refusal:
// counted every time, logged when the refusal starts or its cause changes.
func (s *Service) batchFailed(err error, from int64) {
	ref := classifyRefusal(err)
	if ref == nil {
		return
	}
	s.metrics.refusals.WithLabelValues(ref.cause).Inc()
	s.metrics.refused.Set(1)
	r := &s.refusals
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.current == nil || r.current.cause != ref.cause {
		// A warning: the pass that met the refusal logs its error line
		// already; this one names the cause and the fix, once.
		s.logger.Warn("enqueuer moves refused: no staged job is moved until the cause is fixed; they wait in staged_jobs, none is dead-lettered",
			zap.String("cause", ref.cause), zap.String("fix", ref.fix), zap.Error(err))
	}
	if r.current == nil || from < r.from {
		r.from = from
	}
	r.current, r.err = ref, err.Error()
}

// batchCommitted ends a refusal when a batch taking rows from id from on
// committed: one that took the refused batch's rows, or came after a
// refusal that took none.
func (s *Service) batchCommitted(from int64) {
	r := &s.refusals
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.current == nil || from > r.from {
		return
	}
	s.logger.Info("enqueuer moves no longer refused: moving staged jobs", zap.String("cause", r.current.cause))
	r.current, r.err = nil, ""
	s.metrics.refused.Set(0)
}

// probeArgs is the known-good job the probe inserts.
type probeArgs struct{}

func (probeArgs) Kind() string { return "idemd_probe" }

// probeTable tells a row's refusal from the table's when the SQLSTATE
// does not: it inserts a known-good job through River's client under a
// savepoint of tx, always rolled back. refused is why River's table would
// not take it (nil: it did, so the refusal was the row's); err is a
// failure of the probe itself (the connection), which fails the batch.
// Scheduled an hour out, the job sends no insert notification.
func (s *Service) probeTable(ctx context.Context, tx pgx.Tx) (refused, err error) {
	sp, err := tx.Begin(ctx)
	if err != nil {
		return nil, fmt.Errorf("enqueuer batch: probe savepoint: %w", err)
	}
	res, perr := s.river.InsertManyTx(ctx, sp, []river.InsertManyParams{{
		Args:       probeArgs{},
		InsertOpts: &river.InsertOpts{ScheduledAt: time.Now().Add(time.Hour)},
	}})
	if perr != nil && !isDataError(perr, tx.Conn()) {
		return nil, fmt.Errorf("enqueuer batch: probe: %w", perr)
	}
	if err := sp.Rollback(ctx); err != nil {
		return nil, fmt.Errorf("enqueuer batch: probe rollback: %w", err)
	}
	switch {
	case perr != nil:
		return perr, nil
	case len(res) != 1:
		return errJobsDropped, nil
	}
	return nil, nil
}
