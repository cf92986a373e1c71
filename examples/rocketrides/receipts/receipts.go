// Package receipts is Rocket Rides' River worker for send_ride_receipt, the
// job the API stages when a ride is paid. "Sending" records the receipt in
// the ride_receipts mailbox table, which tests and the demo read as their
// oracle: one receipt per paid ride, however often River retries the job.
package receipts

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
)

// Kind is the River job kind (the article's job_name).
const Kind = "send_ride_receipt"

// Args are the staged job's arguments: the article's amount, currency and
// user_id, plus the ride.
type Args struct {
	Amount   int64  `json:"amount"`
	Currency string `json:"currency"`
	UserID   int64  `json:"user_id"`
	RideID   int64  `json:"ride_id,omitempty"`
}

// Kind implements river.JobArgs.
func (Args) Kind() string { return Kind }

// Worker records receipts.
type Worker struct {
	river.WorkerDefaults[Args]
	Pool *pgxpool.Pool
}

// Work records the receipt once per River job: River may run a job more than
// once (at-least-once), so the insert is keyed on the job id. Two different
// jobs for one ride give two receipts, which is exactly what a test of the
// enqueuer's exactly-once move must be able to see.
func (w *Worker) Work(ctx context.Context, job *river.Job[Args]) error {
	a := job.Args
	tag, err := w.Pool.Exec(ctx, `INSERT INTO ride_receipts (river_job_id, ride_id, user_id, email, amount, currency)
		SELECT $1, $2, u.id, u.email, $4, $5 FROM users u WHERE u.id = $3
		ON CONFLICT (river_job_id) DO NOTHING`,
		job.ID, nullID(a.RideID), a.UserID, a.Amount, a.Currency)
	if err != nil {
		return fmt.Errorf("receipts: record receipt for job %d: %w", job.ID, err)
	}
	if tag.RowsAffected() == 0 {
		var exists bool
		if err := w.Pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM users WHERE id = $1)`, a.UserID).Scan(&exists); err != nil {
			return fmt.Errorf("receipts: look up user %d: %w", a.UserID, err)
		}
		if !exists {
			// Retrying cannot make the user appear: cancel, don't retry.
			return river.JobCancel(fmt.Errorf("receipts: user %d does not exist", a.UserID))
		}
	}
	return nil
}

func nullID(id int64) *int64 {
	if id == 0 {
		return nil
	}
	return &id
}

// Register adds the worker to workers.
func Register(workers *river.Workers, pool *pgxpool.Pool) {
	river.AddWorker(workers, &Worker{Pool: pool})
}
