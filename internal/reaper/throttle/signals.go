package throttle

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Querier runs the primary's read queries: a pool or a connection.
type Querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	Begin(ctx context.Context) (pgx.Tx, error)
}

// Replica is a standby the primary cannot report on (a cascading replica,
// one behind a proxy) read directly: --replica-url.
type Replica struct {
	// Name is the replica's host and port, for logs (never the URL: it may
	// carry a password).
	Name string
	Pool *pgxpool.Pool
}

// Reader reads the signals (Signals) from the database. One run owns one:
// the WAL rate is the difference from its previous reading.
type Reader struct {
	Primary  Querier
	Replicas []Replica
	// ProbeCommit: measure a writing transaction's COMMIT (a limit on
	// commit_latency is set). Without it no probe transaction runs.
	ProbeCommit bool
	// WatchReplicas: a replica limit is set, so replicas the role cannot
	// see are an error (ErrHiddenReplicas) rather than ignored.
	WatchReplicas bool
	// Timeout bounds each reading, so a replica that does not answer makes
	// the run wait (signal_error) rather than hang.
	Timeout time.Duration
	// Now is the clock the readings are stamped with (Signals.At); nil:
	// time.Now.
	Now func() time.Time

	prevLSN uint64
	prevAt  time.Time
	// checkpointsSQL reads the checkpoints (readCheckpoints), set by
	// ReadCheckpoints; empty: not read.
	checkpointsSQL string
}

func (r *Reader) timeout() time.Duration {
	if r.Timeout <= 0 {
		return 5 * time.Second
	}
	return r.Timeout
}

func (r *Reader) now() time.Time {
	if r.Now == nil {
		return time.Now()
	}
	return r.Now()
}

// primarySQL reads the replicas the primary streams to, in one statement
// on pg_stat_replication: the worst replay lag (replay_lag, PostgreSQL's
// own measure of the time from a WAL record's flush on the primary to its
// replay) and the worst distance in bytes from the primary's WAL position
// to a replica's replay position, and the position of the WAL inserted
// for the WAL rate: pg_current_wal_insert_lsn, so a round's WAL counts
// once its records are in, not when the WAL writer writes them out (the
// batches commit without waiting for it), and the interval after a round
// holds only what the API wrote in it. A role without pg_read_all_stats sees only the walsenders' pids,
// every other column NULL: hidden counts them, so the run says what is
// missing rather than believe there is no lag. Walsenders of a base backup
// are not replicas.
const primarySQL = `
SELECT count(*) FILTER (WHERE state IS NULL),
       count(*) FILTER (WHERE state <> 'backup'),
       COALESCE(EXTRACT(epoch FROM max(replay_lag) FILTER (WHERE state <> 'backup')), 0)::float8,
       COALESCE(max(pg_wal_lsn_diff(pg_current_wal_lsn(), replay_lsn)) FILTER (WHERE state <> 'backup'), 0)::int8,
       pg_wal_lsn_diff(pg_current_wal_insert_lsn(), '0/0')::int8
FROM pg_stat_replication`

// replicaSQL reads a standby's replay position and lag. A standby that has
// replayed everything it received is not behind, however old its last
// replayed transaction is (an idle primary writes none); otherwise its lag
// is the age of the last transaction it replayed, which keeps growing
// while its replay is stopped.
const replicaSQL = `
SELECT pg_is_in_recovery(),
       CASE WHEN pg_last_wal_receive_lsn() IS NOT DISTINCT FROM pg_last_wal_replay_lsn() THEN 0
            ELSE COALESCE(EXTRACT(epoch FROM now() - pg_last_xact_replay_timestamp()), 0) END::float8,
       COALESCE(pg_wal_lsn_diff(pg_last_wal_replay_lsn(), '0/0'), 0)::int8`

// ErrHiddenReplicas: the role cannot see the replicas' positions.
var ErrHiddenReplicas = errors.New("pg_stat_replication hides the replicas' positions from this role: " +
	"GRANT pg_read_all_stats TO the reaper's role (deploy/sql/roles.sql does), or set --max-lag 0 and --max-lag-bytes 0 to reap without watching replicas")

// Read reads every signal. A signal that cannot be read is returned in
// Signals.Err with what was read; the caller waits rather than reap blind.
func (r *Reader) Read(ctx context.Context) Signals {
	ctx, cancel := context.WithTimeout(ctx, r.timeout())
	defer cancel()
	var s Signals
	var hidden, seen int64
	var lagSeconds float64
	var lsn int64
	err := r.Primary.QueryRow(ctx, primarySQL).Scan(&hidden, &seen, &lagSeconds, &s.LagBytes, &lsn)
	if err != nil {
		s.Err = fmt.Errorf("read pg_stat_replication: %w", err)
		return s
	}
	now := r.now()
	s.At, s.WALPosition = now, lsn
	s.Replicas = int(seen)
	s.Lag = seconds(lagSeconds)
	if !r.prevAt.IsZero() && uint64(lsn) >= r.prevLSN {
		if dt := now.Sub(r.prevAt).Seconds(); dt > 0 {
			s.WALRate, s.HasWALRate = float64(uint64(lsn)-r.prevLSN)/dt, true
		}
	}
	r.prevLSN, r.prevAt = uint64(lsn), now
	if hidden > 0 && r.WatchReplicas {
		s.Err = ErrHiddenReplicas
		return s
	}
	for _, rep := range r.Replicas {
		var standby bool
		var lag float64
		var replayed int64
		if err := rep.Pool.QueryRow(ctx, replicaSQL).Scan(&standby, &lag, &replayed); err != nil {
			s.Err = fmt.Errorf("read replica %s: %w", rep.Name, err)
			return s
		}
		if !standby {
			s.Err = fmt.Errorf("replica %s is not in recovery (a promoted standby, or a primary): --replica-url names standbys only", rep.Name)
			return s
		}
		s.Replicas++
		s.Lag = max(s.Lag, seconds(lag))
		if behind := lsn - replayed; replayed > 0 && behind > s.LagBytes {
			s.LagBytes = behind
		}
	}
	if r.checkpointsSQL != "" {
		if err := readCheckpoints(ctx, r.Primary, r.checkpointsSQL, &s); err != nil {
			s.Err = err
			return s
		}
	}
	if r.ProbeCommit {
		if s.CommitLatency, err = probeCommit(ctx, r.Primary); err != nil {
			s.Err = err
		}
	}
	return s
}

// quietProbes is how many probes QuietCommit takes, quietProbeEvery apart:
// a fifth of a second, after the run's first batch.
const (
	quietProbes     = 9
	quietProbeEvery = 20 * time.Millisecond
)

// QuietCommit is the median of a few probe commits between batches (the
// reaper's WAL flushed): what the API's commits wait without the reaper,
// the base of the default commit_latency budget.
func (r *Reader) QuietCommit(ctx context.Context) (time.Duration, error) {
	var ds []time.Duration
	for i := range quietProbes {
		if i > 0 {
			t := time.NewTimer(quietProbeEvery)
			select {
			case <-ctx.Done():
				t.Stop()
				return 0, ctx.Err()
			case <-t.C:
			}
		}
		pctx, cancel := context.WithTimeout(ctx, r.timeout())
		d, err := probeCommit(pctx, r.Primary)
		cancel()
		if err != nil {
			return 0, err
		}
		ds = append(ds, d)
	}
	slices.Sort(ds)
	return ds[len(ds)/2], nil
}

// probeCommit times the COMMIT of a transaction that wrote WAL, so its
// commit waits for the WAL flush (and for the synchronous standbys, if any)
// like every API transaction that wrote a key: it queues behind the same
// flushes, the reaper's among them, which is what the API's commits feel.
// Its one WAL record is a transactional logical message
// (pg_logical_emit_message, open to every role): a commit that wrote no
// WAL, such as one that only took a transaction id, would not wait for
// any flush, and measure nothing. It writes no row; logical decoding
// clients receive the message (prefix idemd-reaper-probe) and pgoutput
// ignores it unless asked for messages. The time includes one round trip
// to the server, which a ceiling must allow for. pg_stat_statements was not
// used: it is not always installed, and its times are averages since its
// last reset, not the wait now.
func probeCommit(ctx context.Context, db Querier) (time.Duration, error) {
	tx, err := db.Begin(ctx)
	if err != nil {
		return 0, fmt.Errorf("commit probe: begin: %w", err)
	}
	defer func() {
		// Within a bound of its own: a rollback on a connection that
		// stopped answering must not hang the probe.
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		tx.Rollback(cctx) //nolint:errcheck // a no-op after Commit
	}()
	var lsn string
	if err := tx.QueryRow(ctx, "SELECT pg_logical_emit_message(true, 'idemd-reaper-probe', '')::text").Scan(&lsn); err != nil {
		return 0, fmt.Errorf("commit probe: %w", err)
	}
	start := time.Now()
	if err := tx.Commit(ctx); err != nil {
		return 0, fmt.Errorf("commit probe: commit: %w", err)
	}
	return time.Since(start), nil
}

// roundProbeEvery is the pace of the probes while a round runs: a default
// batch lasts a few hundred milliseconds, so it gets several.
const roundProbeEvery = 20 * time.Millisecond

// ProbeRound probes the commit latency while the reaper's round of batches
// runs, on its own pooled connection, until the returned function is
// called; that function returns what the probes measured (the zero value
// when none finished: the first always finishes unless it fails). It is
// what the API's commits wait for because of the reaper's own WAL, which a
// probe between rounds, after the batches' flushes, cannot see.
//
// The round's end does not cut the probe in flight: that one is often
// the slowest, waiting behind the batch's last WAL, and dropping it would
// hide the tail the sizer bounds. One more probe follows the round's end:
// the batches commit without waiting for their WAL to be flushed
// (synchronous_commit off, batch.go), so the API's next commit flushes
// what the last batch left, and that wait is the reaper's too.
func (r *Reader) ProbeRound(ctx context.Context) func() RoundProbes {
	if !r.ProbeCommit {
		return func() RoundProbes { return RoundProbes{} }
	}
	stop := make(chan struct{})
	done := make(chan []time.Duration, 1)
	probe := func(ds []time.Duration) []time.Duration {
		// Each probe within Timeout: one the database does not answer
		// must not hold the round's end for longer.
		pctx, cancel := context.WithTimeout(ctx, r.timeout())
		defer cancel()
		if d, err := probeCommit(pctx, r.Primary); err == nil {
			ds = append(ds, d)
		}
		return ds
	}
	go func() {
		var ds []time.Duration
		t := time.NewTicker(roundProbeEvery)
		defer t.Stop()
		for {
			ds = probe(ds)
			select {
			case <-stop:
				if ctx.Err() == nil {
					ds = probe(ds)
				}
				done <- ds
				return
			case <-t.C:
			}
		}
	}()
	return func() RoundProbes {
		close(stop)
		return SummarizeProbes(<-done)
	}
}

func seconds(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }

// ReplicaName is a replica's host and port, for logs: never its URL, which
// may carry a password.
func ReplicaName(host string, port uint16) string {
	return fmt.Sprintf("%s:%d", host, port)
}
