package idem

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// StageOptions are River's insert options, carried in staged_jobs' optional
// columns. Zero values leave the columns NULL, meaning River's defaults.
type StageOptions struct {
	Queue       string
	Priority    int
	MaxAttempts int
	ScheduledAt time.Time
	Tags        []string
	// Metadata is a JSON object stored on the River job. StageJob adds the
	// trace context of its ctx to it (see StageJob).
	Metadata json.RawMessage
}

// StageJob inserts a job into staged_jobs inside tx, the transaction of an
// atomic phase, and returns its staged id. The job exists exactly when the
// phase commits; idemd's enqueuer then moves it into River (kind is River's
// job kind, args its JSON-encodable arguments). opts may be nil.
//
// Validation of kind, queue and sizes is the enqueuer's: a row it cannot
// insert goes to staged_jobs_dead with the reason instead of failing the
// API's transaction here.
//
// When ctx carries an OpenTelemetry span (the request's), the job's
// metadata gets its W3C trace context as top-level "traceparent" (and
// "tracestate") strings, where River's otelriver middleware reads it when
// the job is worked: the work span links to the span that staged the job.
// Metadata that already has either key is left as the caller wrote it.
func StageJob(ctx context.Context, tx pgx.Tx, kind string, args any, opts *StageOptions) (int64, error) {
	if kind == "" {
		return 0, errors.New("idem: stage job: empty kind")
	}
	argsJSON, err := json.Marshal(args)
	if err != nil {
		return 0, fmt.Errorf("idem: stage job %s: encode args: %w", kind, err)
	}
	var o StageOptions
	if opts != nil {
		o = *opts
	}
	var metadata *string
	if len(o.Metadata) > 0 && !json.Valid(o.Metadata) {
		return 0, fmt.Errorf("idem: stage job %s: metadata is not valid JSON", kind)
	}
	md, err := withTraceContext(ctx, o.Metadata)
	if err != nil {
		return 0, fmt.Errorf("idem: stage job %s: trace context: %w", kind, err)
	}
	if len(md) > 0 {
		m := string(md)
		metadata = &m
	}
	var id int64
	err = tx.QueryRow(ctx, `INSERT INTO staged_jobs
			(job_name, job_args, queue, priority, max_attempts, scheduled_at, tags, metadata)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
		RETURNING id`,
		kind, string(argsJSON), nullString(o.Queue), nullInt(o.Priority), nullInt(o.MaxAttempts),
		nullTime(o.ScheduledAt), nullTags(o.Tags), metadata).Scan(&id)
	if err != nil {
		return 0, fmt.Errorf("idem: stage job %s: %w", kind, err)
	}
	return id, nil
}

func nullString(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

func nullInt(i int) *int {
	if i == 0 {
		return nil
	}
	return &i
}

func nullTime(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	return &t
}

func nullTags(t []string) []string {
	if len(t) == 0 {
		return nil
	}
	return t
}
