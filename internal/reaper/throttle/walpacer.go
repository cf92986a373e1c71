package throttle

import "time"

// WALPacer holds the server's WAL, while a run reaps, to a rate on
// average: a token bucket in bytes. Credit accrues at the rate, up to a
// small depth; every byte the server wrote between two readings is spent
// (the run's rounds, and what the API writes beside them), and the next
// round may start only when the credit is back to zero, so every round is
// followed by the time its WAL takes at the rate. The whole server's WAL,
// not only the batches': it is what fills max_wal_size, what the
// replicas replay and what the operator's limit is read against, by the
// server's own position. A reading of the rate over a
// short interval (what --max-load wal_rate was before it) sees the quiet
// interval after a burst and lets the next burst through; the bucket
// remembers the burst.
//
// Over any window of W seconds the batches write at most rate·W plus the
// depth plus one round's bytes (the round that started with the credit at
// zero and is paid after it). For --max-load wal_rate=R (NewWALPacer)
// depth and BatchBytes together are 0.35 s of WAL at the rate, so over
// 10 s the rate is within 10 % of the limit even when a round writes half
// again what the run sized it for (the WAL per key moves: a page's first
// change after a checkpoint is logged whole). wal_rate=auto's bucket is
// deep instead (NewBudgetPacer): the bound is held over a checkpoint
// cycle, not over 10 s.
//
// Pure: the caller passes the time of every call. Not safe for concurrent
// use.
type WALPacer struct {
	rate  float64 // bytes per second
	floor float64 // the slowest Halve may make it
	// depth is the most credit the bucket holds, bytes; batch the WAL a
	// round should write (BatchBytes).
	depth, batch float64
	credit       float64 // bytes; negative: owed
	// initial is the credit the first observation starts with.
	initial float64
	at      time.Time
	started bool
	// pos is the WAL position last observed.
	pos int64
}

// pacerDepth and pacerBatch are the burst the bucket allows and the WAL a
// round should write, in seconds of the rate: together well under a
// second, a tenth of the 10 s window the limit is held over. Smaller
// rounds cost more of them (each a few milliseconds of fixed work); at
// PostgreSQL's default checkpoint budget (1.7 MB/s) a round is still a
// few thousand keys.
const (
	pacerDepth = 100 * time.Millisecond
	pacerBatch = 250 * time.Millisecond
	// pacerMaxDebt bounds what is owed, in seconds of the rate: an API
	// that alone writes more than the rate for a while holds the run
	// while it does, and owes nothing older than the 10 s window once it
	// stops.
	pacerMaxDebt = 10 * time.Second
	// pacerFloorShare is how far Halve may slow the pacer: an eighth of
	// its first rate, so a server whose checkpoints are requested by
	// others (a DROP DATABASE, an operator's CHECKPOINT) slows a run,
	// never stops it.
	pacerFloorShare = 8
)

// NewWALPacer returns a pacer for rate bytes per second (positive), held
// within 10 % over every 10 s: --max-load wal_rate=R.
func NewWALPacer(rate float64) *WALPacer {
	depth := rate * pacerDepth.Seconds()
	return &WALPacer{rate: rate, floor: rate / pacerFloorShare, depth: depth, batch: rate * pacerBatch.Seconds(), initial: depth}
}

// NewBudgetPacer returns wal_rate=auto's pacer: b's rate, a bucket b.Depth
// deep that starts with b.Initial, and rounds of b.Batch at most (within
// the pacer's 0.25 s of the rate at least).
func NewBudgetPacer(b Budget) *WALPacer {
	return &WALPacer{rate: b.Rate, floor: b.Rate / pacerFloorShare, depth: b.Depth,
		batch: max(b.Batch, b.Rate*pacerBatch.Seconds()), initial: min(max(b.Initial, 0), b.Depth)}
}

// Rate is the pacer's rate now, bytes per second.
func (p *WALPacer) Rate() float64 { return p.rate }

// BatchBytes is the most WAL the next round should write for the limit to
// hold within 10 % over 10 s: the run sizes its batches from it. While the
// bucket holds credit a round may spend it, up to the pacer's largest
// round (wal_rate=auto's sixteenth of its depth); once the run is paced
// (the credit spent, each round waiting for its own WAL) a round is a
// quarter second of the rate. The rate sets a paced run's speed either
// way; small rounds spread its WAL evenly instead of in bursts of
// megabytes, each of which the API's next commits would wait to flush.
func (p *WALPacer) BatchBytes() float64 {
	return max(min(p.credit, p.batch), p.MinRound())
}

// MinRound is a paced round's WAL, bytes: a quarter second of the rate,
// the least BatchBytes gives.
func (p *WALPacer) MinRound() float64 { return p.rate * pacerBatch.Seconds() }

// Depth is the most WAL the bucket lets through at once, bytes.
func (p *WALPacer) Depth() float64 { return p.depth }

// refill brings the credit up to now. The first call starts the bucket
// with its initial credit (NewWALPacer: full, the run's first round needs
// no wait).
func (p *WALPacer) refill(now time.Time) {
	if !p.started {
		p.started, p.at, p.credit = true, now, p.initial
		return
	}
	if dt := now.Sub(p.at); dt > 0 {
		p.credit = min(p.depth, p.credit+p.rate*dt.Seconds())
		p.at = now
	}
}

// Observe charges the WAL the server wrote since the last observation:
// position is its WAL position at now. The first observation starts the
// bucket.
func (p *WALPacer) Observe(now time.Time, position int64) {
	first := !p.started
	p.refill(now)
	if !first && position > p.pos {
		p.credit = max(p.credit-float64(position-p.pos), -p.rate*pacerMaxDebt.Seconds())
	}
	p.pos = max(p.pos, position)
}

// Wait is how long the next round must wait from now for the rate to
// hold: 0 when it may start.
func (p *WALPacer) Wait(now time.Time) time.Duration {
	p.refill(now)
	if p.credit >= 0 {
		return 0
	}
	return time.Duration(-p.credit / p.rate * float64(time.Second))
}

// Floor is the slowest the pacer lets the run's own rounds go, bytes per
// second: an eighth of its first rate.
func (p *WALPacer) Floor() float64 { return p.floor }

// Halve halves the rate, the depth and the rounds (not below an eighth of
// the first rate), for a checkpoint the server had to request during the
// run: the WAL since the last checkpoint reached max_wal_size's share
// before checkpoint_timeout, so the credit the bucket held is spent too.
// What is owed is owed at the new rate. It reports whether the rate
// changed.
func (p *WALPacer) Halve() bool {
	if p.rate <= p.floor {
		return false
	}
	f := max(p.rate/2, p.floor) / p.rate
	p.rate, p.depth, p.batch = p.rate*f, p.depth*f, p.batch*f
	p.credit = min(p.credit, 0)
	return true
}
