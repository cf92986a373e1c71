package idem

import (
	"context"
	"fmt"
	"sync"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"

	"github.com/idemd/idemd/internal/riverdb"
)

// Stager stages River jobs exactly as a River client's InsertTx would
// insert them: River itself encodes the args and applies the kind's
// InsertOpts(), the client's MaxAttempts, the call's InsertOpts, the
// client's and the kind's insert middleware and insert hooks, and computes
// a unique job's key and states from its UniqueOpts, all at the moment the
// API stages the job, inside the API's transaction. Only River's final
// write is replaced: instead of a river_job row, the job goes into
// staged_jobs with what River would have written, and idemd's enqueuer
// writes that row into river_job once the transaction has committed, with
// River's own unique-job conflict handling. A job River would keep one of
// is kept once.
//
// A Stager is safe for concurrent use. Make one per River configuration
// (NewStager); StageInsertTx uses one with River's defaults.
type Stager struct {
	client *river.Client[pgx.Tx]
	// testClock: River's Config.Test.Time is stubbed, and sets CreatedAt.
	testClock bool
}

// NewStager returns a Stager that stages as a River client configured
// with cfg inserts: pass the API's own River configuration. What shapes an
// insert is applied as InsertTx applies it: Plugins, Hooks, Middleware and
// JobInsertMiddleware (insert middleware and HookInsertBegin, the kind's
// own included), MaxAttempts, Workers (with Workers set, a kind without a
// worker is refused, as InsertTx refuses it), SkipUnknownJobCheck,
// SkipJobKindValidation, Test and Logger. What only shapes River's workers
// and maintenance (Queues, PeriodicJobs, retention, ...) is left out. What
// staging cannot honour is refused with an error naming it, never dropped:
// a Schema (the enqueuer writes River in the schema its role resolves
// first), and, at InsertTx, an ID or CreatedAt that insert middleware or a
// hook sets (a River job's are the move's). cfg may be nil.
func NewStager(cfg *river.Config) (*Stager, error) {
	c, err := riverdb.StagingConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("idem: stager: %w", err)
	}
	client, err := river.NewClient[pgx.Tx](riverdb.NewDriver(nil), c)
	if err != nil {
		return nil, fmt.Errorf("idem: stager: %w", err)
	}
	return &Stager{client: client, testClock: c.Test.Time != nil}, nil
}

var (
	defaultStagerOnce sync.Once
	defaultStager     *Stager
	defaultStagerErr  error
)

// StageInsertTx stages args as River's InsertTx with a default client
// (River's defaults, no middleware, no hooks) would insert it, and
// returns the staged id; see Stager.InsertTx.
func StageInsertTx(ctx context.Context, tx pgx.Tx, args river.JobArgs, opts *river.InsertOpts) (int64, error) {
	defaultStagerOnce.Do(func() { defaultStager, defaultStagerErr = NewStager(nil) })
	if defaultStagerErr != nil {
		return 0, defaultStagerErr
	}
	return defaultStager.InsertTx(ctx, tx, args, opts)
}

// InsertTx stages args inside tx, the transaction of an atomic phase, as
// River's InsertTx would insert it, and returns the staged id. The job
// exists exactly when tx commits. River's errors (an invalid queue, tag or
// priority, invalid UniqueOpts, an unknown kind) are returned as InsertTx
// returns them, and nothing is staged. Pending jobs (InsertOpts.Pending)
// are refused: a staged job becomes available or scheduled.
//
// When ctx carries an OpenTelemetry span, the job's metadata gets its W3C
// trace context, as StageJob adds it.
func (s *Stager) InsertTx(ctx context.Context, tx pgx.Tx, args river.JobArgs, opts *river.InsertOpts) (int64, error) {
	p, err := riverdb.Capture(ctx, s.testClock, func(ctx context.Context) error {
		_, err := s.client.InsertTx(ctx, tx, args, opts)
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("idem: stage job %s: %w", args.Kind(), err)
	}
	if p.State == rivertype.JobStatePending {
		return 0, fmt.Errorf("idem: stage job %s: pending jobs (InsertOpts.Pending) cannot be staged", p.Kind)
	}
	md, err := withTraceContext(ctx, p.Metadata)
	if err != nil {
		return 0, fmt.Errorf("idem: stage job %s: trace context: %w", p.Kind, err)
	}
	var (
		scheduledAt  any // NULL: at the move, as River's now()
		uniqueStates pgtype.Bits
	)
	if p.ScheduledAt != nil {
		scheduledAt = *p.ScheduledAt
	}
	if p.UniqueKey != nil {
		uniqueStates = pgtype.Bits{Bytes: []byte{p.UniqueStates}, Len: 8, Valid: true}
	}
	var id int64
	err = tx.QueryRow(ctx, `INSERT INTO staged_jobs
			(job_name, job_args, queue, priority, max_attempts, scheduled_at, tags, metadata, unique_key, unique_states)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)
		RETURNING id`,
		p.Kind, string(p.EncodedArgs), p.Queue, p.Priority, p.MaxAttempts, scheduledAt, p.Tags, string(md),
		p.UniqueKey, uniqueStates).Scan(&id)
	if err != nil {
		return 0, fmt.Errorf("idem: stage job %s: %w", p.Kind, err)
	}
	return id, nil
}
