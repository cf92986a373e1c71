package enqueuer

import (
	"context"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river/riverdriver"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
)

// stagedUniqueDriver is River's pgx driver for the Go path's insert-only
// client, with one change: a job whose staged row carries a unique key
// and states (rawArgs) is inserted with those, which River's insert then
// handles as its own (its ON CONFLICT, its duplicate flag). River computes
// a unique key only from UniqueOpts, at insert time; a staged row's key was
// computed when the API staged it (idem.StageInsertTx, or the API's own
// River client code), which is when InsertTx would have computed it.
// Everything else about the insert is River's.
type stagedUniqueDriver struct {
	*riverpgxv5.Driver
}

func (d stagedUniqueDriver) UnwrapExecutor(tx pgx.Tx) riverdriver.ExecutorTx {
	return stagedUniqueExecutor{d.Driver.UnwrapExecutor(tx)}
}

type stagedUniqueExecutor struct {
	riverdriver.ExecutorTx
}

func (e stagedUniqueExecutor) JobInsertFastMany(ctx context.Context, params *riverdriver.JobInsertFastManyParams) ([]*riverdriver.JobInsertFastResult, error) {
	withStagedUnique(params)
	return e.ExecutorTx.JobInsertFastMany(ctx, params)
}

func (e stagedUniqueExecutor) JobInsertFastManyNoReturning(ctx context.Context, params *riverdriver.JobInsertFastManyParams) (int, error) {
	withStagedUnique(params)
	return e.ExecutorTx.JobInsertFastManyNoReturning(ctx, params)
}

func withStagedUnique(params *riverdriver.JobInsertFastManyParams) {
	for _, j := range params.Jobs {
		if a, ok := j.Args.(rawArgs); ok && a.uniqueKey != nil {
			j.UniqueKey, j.UniqueStates = a.uniqueKey, a.uniqueStates
		}
	}
}
