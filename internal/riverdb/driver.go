package riverdb

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river/riverdriver"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivertype"
)

// Driver is River's pgx driver with River's final write of an insert
// (JobInsertFastMany, and its variant without RETURNING) taken over in
// two ways, the only two idemd needs:
//
//   - Capture: River computes everything about the job (its args, options,
//     middleware, hooks, unique key and states) and, instead of writing a
//     river_job row, hands the job's parameters to the caller. idem's
//     Stager stages a job this way, so it is staged as River's InsertTx
//     would insert it.
//   - StagedArgs: a job whose args carry a staged row's unique key and
//     states is inserted with those, which River's insert then handles as
//     its own (its ON CONFLICT, its duplicate flag). River computes a
//     unique key only from UniqueOpts, at insert time; a staged row's key
//     was computed when the API staged it, which is when InsertTx would
//     have computed it. The enqueuer's Go path inserts this way.
//
// Everything else is River's. River's driver interface is exempt from
// River's semver: this file is the one place idemd uses it, and
// TestDriverOverrides lists what it overrides.
type Driver struct {
	*riverpgxv5.Driver
}

// NewDriver returns the driver on pool; nil for a driver that only
// captures (a Stager's: River reads nothing from the database on the way
// to its final write, and the write is the capture).
func NewDriver(pool *pgxpool.Pool) Driver {
	return Driver{riverpgxv5.New(pool)}
}

// UnwrapExecutor is the override River's InsertTx reaches the write
// through.
func (d Driver) UnwrapExecutor(tx pgx.Tx) riverdriver.ExecutorTx {
	return executor{d.Driver.UnwrapExecutor(tx)}
}

type executor struct {
	riverdriver.ExecutorTx
}

func (e executor) JobInsertFastMany(ctx context.Context, params *riverdriver.JobInsertFastManyParams) ([]*riverdriver.JobInsertFastResult, error) {
	if slot, ok := ctx.Value(captureKey{}).(*captureSlot); ok {
		return nil, slot.take(params)
	}
	withStagedUnique(params)
	return e.ExecutorTx.JobInsertFastMany(ctx, params)
}

func (e executor) JobInsertFastManyNoReturning(ctx context.Context, params *riverdriver.JobInsertFastManyParams) (int, error) {
	if slot, ok := ctx.Value(captureKey{}).(*captureSlot); ok {
		return 0, slot.take(params)
	}
	withStagedUnique(params)
	return e.ExecutorTx.JobInsertFastManyNoReturning(ctx, params)
}

// StagedArgs hands River a staged row's job_args unchanged, and the row's
// unique key and states (nil key: not unique) to Driver.
type StagedArgs struct {
	KindName     string
	Args         json.RawMessage
	UniqueKey    []byte
	UniqueStates byte
}

func (a StagedArgs) Kind() string                 { return a.KindName }
func (a StagedArgs) MarshalJSON() ([]byte, error) { return a.Args, nil }

func withStagedUnique(params *riverdriver.JobInsertFastManyParams) {
	for _, j := range params.Jobs {
		if a, ok := j.Args.(StagedArgs); ok && a.UniqueKey != nil {
			j.UniqueKey, j.UniqueStates = a.UniqueKey, a.UniqueStates
		}
	}
}

// Job is what River's insert would have written for one job, as Capture
// returns it: the river_job columns River computes. Its fields are
// riverdriver.JobInsertFastParams' that a staged row carries
// (TestJobInsertFastParamsClassified says what becomes of each of the
// others).
type Job struct {
	Kind        string
	EncodedArgs []byte
	Queue       string
	Priority    int
	MaxAttempts int
	// ScheduledAt is set for a scheduled job; nil for an available one
	// (River's now() at the write).
	ScheduledAt *time.Time
	State       rivertype.JobState
	Tags        []string
	Metadata    []byte
	// UniqueKey is nil for a job that is not unique.
	UniqueKey    []byte
	UniqueStates byte
}

// jobFate classifies River's parameters of one insert
// (rivertype.JobInsertParams, which River's driver receives as
// riverdriver.JobInsertFastParams) as a Stager treats them: copied into
// Job and staged_jobs, applied by River before the capture, or refused.
var jobFate = map[string]fate{
	"Args":         applied, // encoded into EncodedArgs; a unique key is computed from it
	"EncodedArgs":  copied,
	"Kind":         copied,
	"MaxAttempts":  copied,
	"Metadata":     copied,
	"Priority":     copied,
	"Queue":        copied,
	"ScheduledAt":  copied, // of a scheduled job; an available one's is the move's now()
	"State":        copied, // available or scheduled; idem refuses pending
	"Tags":         copied,
	"UniqueKey":    copied,
	"UniqueStates": copied,
	"ID":           refused,
	"CreatedAt":    refused,
}

// jobRefusal says why each refused parameter cannot be staged.
var jobRefusal = map[string]string{
	"ID": "an insert middleware or hook set the job's ID: River's table assigns a staged job's ID when the enqueuer " +
		"moves it, so staging cannot keep it",
	"CreatedAt": "an insert middleware or hook set the job's CreatedAt: a River job's created_at is the time " +
		"the enqueuer moves it, so staging cannot keep it",
}

var errJobRefused = errors.New("riverdb: job refused for staging")

// sortedFates lists the names m gives fate f, in order.
func sortedFates(m map[string]fate, f fate) []string {
	var names []string
	for name, g := range m {
		if g == f {
			names = append(names, name)
		}
	}
	slices.Sort(names)
	return names
}

// ErrCaptured ends River's insert where it would write river_job.
var ErrCaptured = errors.New("riverdb: insert captured")

type captureKey struct{}

type captureSlot struct {
	job *riverdriver.JobInsertFastParams
}

func (s *captureSlot) take(params *riverdriver.JobInsertFastManyParams) error {
	if len(params.Jobs) != 1 || s.job != nil {
		return errors.New("riverdb: a captured insert writes exactly one job")
	}
	s.job = params.Jobs[0]
	return ErrCaptured
}

// Capture runs insert (a River client's InsertTx on a Driver's client)
// with ctx marked so the Driver captures the one job River would write
// instead of writing it, and returns that job. insert's error is
// returned as it is unless it is ErrCaptured. A job with a parameter
// staging cannot keep (jobRefusal) is refused with an error; testClock
// says the client has a stubbed Config.Test.Time, which sets every job's
// CreatedAt, and accepts it.
func Capture(ctx context.Context, testClock bool, insert func(ctx context.Context) error) (*Job, error) {
	slot := &captureSlot{}
	err := insert(context.WithValue(ctx, captureKey{}, slot))
	if !errors.Is(err, ErrCaptured) {
		if err == nil {
			err = errors.New("River inserted the job without the driver capturing it")
		}
		return nil, err
	}
	p := slot.job
	// What River computed that a staged job cannot keep is refused, never
	// replaced at the move without a word.
	v := reflect.ValueOf(p).Elem()
	for _, name := range sortedFates(jobFate, refused) {
		if name == "CreatedAt" && testClock {
			// River's stubbed test clock set it, as it does for every
			// insert of such a client; the unique period was computed from
			// it, as InsertTx computes it.
			continue
		}
		if !v.FieldByName(name).IsZero() {
			return nil, fmt.Errorf("%w: %s", errJobRefused, jobRefusal[name])
		}
	}
	j := &Job{
		Kind: p.Kind, EncodedArgs: p.EncodedArgs, Queue: p.Queue, Priority: p.Priority, MaxAttempts: p.MaxAttempts,
		State: p.State, Tags: p.Tags, Metadata: p.Metadata, UniqueKey: p.UniqueKey, UniqueStates: p.UniqueStates,
	}
	if p.ScheduledAt != nil && p.State == rivertype.JobStateScheduled {
		at := *p.ScheduledAt
		j.ScheduledAt = &at
	}
	return j, nil
}
