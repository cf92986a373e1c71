package throttle

import (
	"context"
	"fmt"
	"math"
	"time"
)

// Checkpoints is what the server says about its checkpoints, read before a
// run's first batch.
type Checkpoints struct {
	// MaxWALSize, Timeout and CompletionTarget are max_wal_size,
	// checkpoint_timeout and checkpoint_completion_target.
	MaxWALSize       float64
	Timeout          time.Duration
	CompletionTarget float64
	// SegmentSize is wal_segment_size: PostgreSQL counts the WAL toward a
	// checkpoint in whole segments.
	SegmentSize float64
	// Requested counts the checkpoints the server requested (WAL volume,
	// CHECKPOINT, DROP DATABASE) since its statistics were reset:
	// pg_stat_bgwriter.checkpoints_req up to PostgreSQL 16,
	// pg_stat_checkpointer.num_requested from 17.
	Requested int64
}

// checkpointShare is how much of the WAL that makes the server request a
// checkpoint a run lets it write per checkpoint_timeout. PostgreSQL
// requests one when the WAL since the last checkpoint reaches
// max_wal_size / (1 + checkpoint_completion_target) in whole segments,
// less one (32 segments of 16 MB at the defaults, 1GB and 0.9: 1.79 MB/s
// over 5min; RequestThreshold); the pacer
// holds the server's whole WAL, the API's included, to 0.8 of that, so
// the rounding to segments, a checkpoint that starts late and the WAL
// written before the run starts fit in the rest.
const checkpointShare = 0.8

// WALBudget is the server's WAL rate, bytes per second, that lets its
// checkpoints come on checkpoint_timeout's schedule: 1.43 MB/s at
// PostgreSQL's defaults (max_wal_size 1GB, checkpoint_timeout 5min,
// checkpoint_completion_target 0.9). 0 when a setting is unknown.
func (c Checkpoints) WALBudget() float64 {
	if c.Timeout <= 0 {
		return 0
	}
	return checkpointShare * c.RequestThreshold() / c.Timeout.Seconds()
}

// RequestThreshold is the WAL since the last checkpoint at which the
// server requests the next (xlog.c's CheckPointSegments, and
// XLogCheckpointNeeded's one segment less); at least a segment. 0 when a
// setting is unknown.
func (c Checkpoints) RequestThreshold() float64 {
	if c.MaxWALSize <= 0 || c.SegmentSize <= 0 || c.CompletionTarget < 0 {
		return 0
	}
	segments := math.Floor(c.MaxWALSize / c.SegmentSize / (1 + c.CompletionTarget))
	return max(segments-1, 1) * c.SegmentSize
}

// checkpointSettingsSQL reads max_wal_size in bytes, checkpoint_timeout in
// seconds, checkpoint_completion_target, and the server's version for the
// statistics view.
const checkpointSettingsSQL = `
SELECT pg_size_bytes(current_setting('max_wal_size'))::float8,
       (SELECT setting::float8 FROM pg_settings WHERE name = 'checkpoint_timeout'),
       current_setting('checkpoint_completion_target')::float8,
       pg_size_bytes(current_setting('wal_segment_size'))::float8,
       current_setting('server_version_num')::int`

// Requested checkpoints moved from pg_stat_bgwriter to
// pg_stat_checkpointer in PostgreSQL 17.
const (
	requestedBefore17SQL = `SELECT checkpoints_req FROM pg_stat_bgwriter`
	requestedSince17SQL  = `SELECT num_requested FROM pg_stat_checkpointer`
)

// ReadCheckpoints reads the server's checkpoint settings and its count of
// requested checkpoints, and sets the Reader to read the count with every
// reading after (Signals.RequestedCheckpoints).
func (r *Reader) ReadCheckpoints(ctx context.Context) (Checkpoints, error) {
	ctx, cancel := context.WithTimeout(ctx, r.timeout())
	defer cancel()
	var c Checkpoints
	var timeout float64
	var version int
	if err := r.Primary.QueryRow(ctx, checkpointSettingsSQL).Scan(&c.MaxWALSize, &timeout, &c.CompletionTarget, &c.SegmentSize, &version); err != nil {
		return Checkpoints{}, fmt.Errorf("read max_wal_size and checkpoint_timeout: %w", err)
	}
	c.Timeout = seconds(timeout)
	r.requestedSQL = requestedBefore17SQL
	if version >= 170000 {
		r.requestedSQL = requestedSince17SQL
	}
	if err := r.Primary.QueryRow(ctx, r.requestedSQL).Scan(&c.Requested); err != nil {
		return Checkpoints{}, fmt.Errorf("read the requested checkpoints: %w", err)
	}
	return c, nil
}
