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
	// SinceRedo is the WAL written since the redo of the last checkpoint
	// the control file records (pg_control_checkpoint()): at least what
	// the current checkpoint cycle has written (while a checkpoint is in
	// progress the file still holds the one before it, and the figure
	// is larger).
	SinceRedo float64
	// Requested counts the checkpoints the server requested (WAL volume,
	// CHECKPOINT, DROP DATABASE) since its statistics were reset:
	// pg_stat_bgwriter.checkpoints_req up to PostgreSQL 16,
	// pg_stat_checkpointer.num_requested from 17.
	Requested int64
}

// Budget is wal_rate=auto's WAL pacer (NewBudgetPacer): a rate, the WAL
// the bucket may let through at once (Depth), the most a round should
// write (Batch), and the credit the run starts with (Initial).
type Budget struct {
	Rate, Depth, Batch, Initial float64
}

// budgetDepthShare and budgetBatchShare split the WAL that makes the
// server request a checkpoint (RequestThreshold) into the bucket's depth,
// one round's most and the rate that fills the rest over
// checkpoint_timeout. A token bucket lets through at most its depth plus
// rate·W plus the round paid after its credit ran out in any window of W,
// so over any checkpoint_timeout the server's WAL stays under the
// threshold: a checkpoint comes on its schedule, never requested by
// volume, with nothing set aside by guess. The split is a choice: a fifth
// as depth lets a run whose whole WAL is under it (a few hundred thousand
// keys on PostgreSQL's defaults, millions on a server with a larger
// max_wal_size) go at full speed, and costs a longer run a fifth of the
// rate it could keep.
const (
	budgetDepthShare = 5  // depth: a fifth of the threshold
	budgetBatchShare = 16 // a round: a sixteenth of the depth
)

// WALBudget is wal_rate=auto's pacer for the server: at PostgreSQL's
// defaults (max_wal_size 1GB, checkpoint_timeout 5min,
// checkpoint_completion_target 0.9; a checkpoint requested after 512 MiB)
// 1.41 MB/s with 107 MB at once and rounds of 6.7 MB at most. Initial is
// the depth less the WAL written since the last checkpoint's redo
// (SinceRedo), so a run that starts late in a busy cycle (or right after
// another run) starts with what is left of it. The zero Budget when a
// setting is unknown.
func (c Checkpoints) WALBudget() Budget {
	v := c.RequestThreshold()
	if c.Timeout <= 0 || v <= 0 {
		return Budget{}
	}
	depth := v / budgetDepthShare
	batch := depth / budgetBatchShare
	return Budget{
		Rate:    (v - depth - batch) / c.Timeout.Seconds(),
		Depth:   depth,
		Batch:   batch,
		Initial: max(depth-c.SinceRedo, 0),
	}
}

// RequestThreshold is the most WAL since the last checkpoint's redo the
// server writes without requesting the next, by PostgreSQL 15's xlog.c:
// CalculateCheckpointSegments sets CheckPointSegments to max_wal_size in
// segments / (1 + checkpoint_completion_target), rounded down, and
// XLogWrite requests a checkpoint when it finishes a segment whose number
// is CheckPointSegments-1 past the redo's segment
// (XLogCheckpointNeeded). With the redo at the end of its segment that is
// CheckPointSegments-1 whole segments after it: 32 of 16 MB at the
// defaults (64 segments / 1.9 = 33). At least a segment. 0 when a setting
// is unknown.
func (c Checkpoints) RequestThreshold() float64 {
	if c.MaxWALSize <= 0 || c.SegmentSize <= 0 || c.CompletionTarget < 0 {
		return 0
	}
	segments := math.Floor(c.MaxWALSize / c.SegmentSize / (1 + c.CompletionTarget))
	return max(segments-1, 1) * c.SegmentSize
}

// checkpointSettingsSQL reads max_wal_size in bytes, checkpoint_timeout in
// seconds, checkpoint_completion_target, wal_segment_size, the server's
// version for the statistics view, and the WAL since the last
// checkpoint's redo (pg_control_checkpoint() may be run by any role).
const checkpointSettingsSQL = `
SELECT pg_size_bytes(current_setting('max_wal_size'))::float8,
       (SELECT setting::float8 FROM pg_settings WHERE name = 'checkpoint_timeout'),
       current_setting('checkpoint_completion_target')::float8,
       pg_size_bytes(current_setting('wal_segment_size'))::float8,
       current_setting('server_version_num')::int,
       pg_wal_lsn_diff(pg_current_wal_lsn(), (SELECT redo_lsn FROM pg_control_checkpoint()))::float8`

// checkpointsBefore17SQL and checkpointsSince17SQL read the requested
// checkpoints, the checkpoints begun, and the control file's last
// checkpoint (Signals.ControlRedo, ControlAge): the counts moved from
// pg_stat_bgwriter to pg_stat_checkpointer in PostgreSQL 17. Both counts
// rise as a checkpoint begins (the checkpointer reports them while it
// writes); the control file changes when it completes.
const (
	checkpointsBefore17SQL = `
SELECT s.checkpoints_req, s.checkpoints_timed + s.checkpoints_req,
       pg_wal_lsn_diff(c.redo_lsn, '0/0')::int8, EXTRACT(epoch FROM now() - c.checkpoint_time)::float8
FROM pg_stat_bgwriter s, pg_control_checkpoint() c`
	checkpointsSince17SQL = `
SELECT s.num_requested, s.num_timed + s.num_requested,
       pg_wal_lsn_diff(c.redo_lsn, '0/0')::int8, EXTRACT(epoch FROM now() - c.checkpoint_time)::float8
FROM pg_stat_checkpointer s, pg_control_checkpoint() c`
)

// readCheckpoints reads the checkpoint fields of s with sql.
func readCheckpoints(ctx context.Context, db Querier, sql string, s *Signals) error {
	var age float64
	if err := db.QueryRow(ctx, sql).Scan(&s.RequestedCheckpoints, &s.CheckpointsBegun, &s.ControlRedo, &age); err != nil {
		return fmt.Errorf("read the checkpoints: %w", err)
	}
	s.ControlAge = seconds(age)
	return nil
}

// ReadCheckpoints reads the server's checkpoint settings and its count of
// requested checkpoints, and sets the Reader to read the checkpoints with
// every reading after (Signals.RequestedCheckpoints, CheckpointsBegun,
// ControlRedo, ControlAge).
func (r *Reader) ReadCheckpoints(ctx context.Context) (Checkpoints, error) {
	ctx, cancel := context.WithTimeout(ctx, r.timeout())
	defer cancel()
	var c Checkpoints
	var timeout float64
	var version int
	if err := r.Primary.QueryRow(ctx, checkpointSettingsSQL).Scan(&c.MaxWALSize, &timeout, &c.CompletionTarget, &c.SegmentSize, &version, &c.SinceRedo); err != nil {
		return Checkpoints{}, fmt.Errorf("read max_wal_size, checkpoint_timeout and the last checkpoint: %w", err)
	}
	c.Timeout = seconds(timeout)
	r.checkpointsSQL = checkpointsBefore17SQL
	if version >= 170000 {
		r.checkpointsSQL = checkpointsSince17SQL
	}
	var s Signals
	if err := readCheckpoints(ctx, r.Primary, r.checkpointsSQL, &s); err != nil {
		return Checkpoints{}, err
	}
	c.Requested = s.RequestedCheckpoints
	return c, nil
}
