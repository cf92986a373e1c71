package enqueuer

import (
	"math"
	"slices"
	"sync"
	"time"

	"go.uber.org/zap"
)

// Where a drain starts, and why it still finds every committed row.
//
// Every row the enqueuer moves leaves a dead entry in staged_jobs_pkey until
// VACUUM removes it, and VACUUM cannot while any transaction holds a
// snapshot older than the delete. A take that starts at the lowest id walks
// all of those entries, so its cost grew with the age of the oldest
// snapshot. A drain therefore starts at a floor: the lowest id
// it has been told about since the previous drain began.
//
// Sources of the floor:
//
//   - A notification. The staged_jobs trigger (migration 00015) sends, per
//     inserting statement, the lowest id that statement inserted; PostgreSQL
//     delivers it only after the transaction's commit is visible to new
//     snapshots. The listener lowers the floor to it and then wakes the
//     loop. So when a row R's transaction commits, a drain that begins after
//     its notification was handled starts at or below R's statement's low
//     id, and its first snapshot sees R. The low id is only a lower bound
//     for that transaction's own rows, which is all it needs to be: a
//     transaction that inserted id 100 and commits after one that inserted
//     id 200 sends its own "100", and the drain it wakes starts at or
//     below 100 however far past 200 earlier drains went.
//   - Start, a listener (re)connect, a retry after a failed drain, and a
//     notification with no number in it (something else notifying on the
//     channel; the trigger of a schema below 00015 sent none, though the
//     enqueuer no longer runs there): a
//     full pass, from the start of the index. A
//     reconnect's full pass finds the rows whose notifications were lost
//     while the listener was down (it begins after LISTEN is back, so
//     anything committed later notifies again); a retry's finds the rows
//     of the failed drain.
//   - The sweep, every SweepInterval on its own connection (sweep.go): a
//     plain read of the lowest committed id (it sees rows other
//     transactions hold locked, too). It lowers the floor to that id and
//     wakes the loop. It covers everything a notification can miss while
//     the listener looks healthy: rows another replica had locked (so our
//     drain skipped them) and then rolled back, a replica killed
//     mid-batch, a notification lost for any other reason; and, with no
//     listener (--poll-only, or a listener that is down), it is the only
//     wake-up, so a row waits at most about one SweepInterval, as before.
//     The sweep reads from a low-water mark below which no row can exist
//     or appear, so it too skips the dead entries; every
//     lowwater.FullEvery-th sweep reads from the start of the index, off the move path (it holds
//     no row lock and no batch waits for it).
//
// The loop takes the floor (resetting it) before the drain's first
// snapshot; a notification handled after that lowers the new floor and
// wakes the loop again, so none is lost between drains. A wake that finds
// no floor was already covered by a drain that began after it.
//
// Within a drain, batches start at a shared cursor: each batch claims
// [c, c+BatchSize) and takes the first BatchSize unlocked rows with
// id >= c. A full batch took BatchSize distinct ids >= c, so its last id is
// at least c+BatchSize-1 and it took every unlocked visible row up to its
// last id; the cursor then jumps past that last id. A short batch took
// every unlocked visible row >= c and ends the drain. So the claimed
// ranges tile [floor, cursor) and a row a drain passes over without taking
// it was either locked by another transaction (another replica's batch,
// which commits or is covered by its retry or by the sweep) or committed
// after the batch's snapshot (its notification lowers the next floor).
const noFloor = math.MaxInt64

// fullPass is the floor of a drain from the start of the index (below any
// id, explicit negative ones included).
const fullPass = math.MinInt64

// floor is where the next drain starts.
type floor struct {
	mu sync.Mutex
	// notified is the lowest id notifications (and full-pass requests,
	// which ask for fullPass) named since the last drain took the floor.
	notified int64
	// swept is the lowest id the sweep found since then; sweptListening
	// says a sweep found it while the listener was up, so notifications
	// were expected to cover it.
	swept          int64
	sweptListening bool
	// untilEmpty: the full pass asked for is --once's, repeated until one
	// takes nothing (lowerUntilEmpty).
	untilEmpty bool
	// notifications counts the notifications that lowered the floor since
	// the last drain took it (coalesce.go waits for a few); notifyRate is
	// their decayed rate as of lastNotify (decayedRate).
	notifications int
	notifyRate    float64
	lastNotify    time.Time
}

func newFloor() *floor { return &floor{notified: noFloor, swept: noFloor} }

// lower records that a drain must start at or below id.
func (f *floor) lower(id int64) {
	f.mu.Lock()
	f.notified = min(f.notified, id)
	f.mu.Unlock()
}

// notify is lower for a notification's id, heard at now, counted for
// coalescing.
func (f *floor) notify(id int64, now time.Time) {
	f.mu.Lock()
	f.notified = min(f.notified, id)
	f.notifications++
	f.notifyRate = decayedRate(f.notifyRate, f.lastNotify, now, 1)
	f.lastNotify = now
	f.mu.Unlock()
}

// rate is the notifications' decayed rate at now, a second.
func (f *floor) rate(now time.Time) float64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return decayedRate(f.notifyRate, f.lastNotify, now, 0)
}

// pending is how many notifications lowered the floor since the last drain
// took it.
func (f *floor) pending() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.notifications
}

// lowerUntilEmpty asks for full passes until one takes nothing: the pass
// asks again after a full pass that took rows. It is --once's request
// (runOnce): with no listener and no sweep beside it, only another full
// pass finds the rows a pass moved past while another transaction held
// them locked.
func (f *floor) lowerUntilEmpty() {
	f.mu.Lock()
	f.notified = fullPass
	f.untilEmpty = true
	f.mu.Unlock()
}

// lowerSwept records a row the sweep found.
func (f *floor) lowerSwept(id int64, listening bool) {
	f.mu.Lock()
	if id < f.swept {
		f.swept = id
		f.sweptListening = listening
	}
	f.mu.Unlock()
}

// drainSpec is where one drain starts.
type drainSpec struct {
	from int64 // the lowest id the drain looks at; fullPass: all
	// gapBelow: rows this drain takes with ids below it are rows that only
	// the sweep found, below where this replica's notified drains had
	// already taken rows (fullPass: count none).
	gapBelow int64
	// untilEmpty: a full pass of --once; if it takes rows, another follows.
	untilEmpty bool
}

// take returns the next drain's spec and resets the floor; ok is false
// when nothing asked for a drain since the last one began. passed is the
// highest id this replica has taken.
func (f *floor) take(passed int64) (spec drainSpec, ok bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	from := min(f.notified, f.swept)
	if from == noFloor {
		return drainSpec{}, false
	}
	spec = drainSpec{from: from, gapBelow: fullPass, untilEmpty: f.untilEmpty}
	if f.swept < f.notified && f.sweptListening {
		// Rows at or above a pending notification's id are that
		// notification's, and rows above anything this replica took are
		// simply new: neither is a gap.
		spec.gapBelow = min(f.notified, passed)
	}
	f.notified, f.swept, f.sweptListening, f.untilEmpty, f.notifications = noFloor, noFloor, false, false, 0
	return spec, true
}

// cursor hands out where each batch of one drain starts.
type cursor struct {
	mu   sync.Mutex
	next int64
}

// claim returns the id the next batch starts at and moves the cursor past
// the ids that batch is sure to cover if it comes back full.
func (c *cursor) claim(batch int) int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	from := c.next
	if c.next <= math.MaxInt64-int64(batch) {
		c.next += int64(batch)
	} else {
		c.next = math.MaxInt64
	}
	return from
}

// passed records that a full batch took every unlocked visible row from
// its start up to last.
func (c *cursor) passed(last int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if last < math.MaxInt64 {
		c.next = max(c.next, last+1)
	}
}

// The sweep's low-water mark (sweep.go reads what it needs). A read from
// the start of staged_jobs_pkey walks every dead entry an old snapshot
// keeps, so the sweep reads from a mark below which no staged row can exist
// now or appear later. It is established from the id sequence and the
// locks on it:
//
//  1. nextval() locks the sequence (RowExclusiveLock, held to the end of
//     the transaction) before it hands out an id, and with CACHE 1 (a
//     serial column's default) every id it hands out is at most the
//     sequence's last value from then on. So if a sweep reads the last
//     value s and then the set V of transactions holding a lock on the
//     sequence, every transaction that holds an id ≤ s is in V or has
//     ended.
//  2. At a later sweep, once no transaction of V is left, every id ≤ s
//     belongs to a transaction that has ended: committed (its rows are
//     visible to any snapshot taken from now on, since a transaction's
//     locks are released after its commit became visible) or rolled back.
//  3. That sweep then reads the lowest committed id m with a new snapshot.
//     No id below min(m, s+1) (and above the previous mark) is staged now,
//     and none can be later: its transaction has ended, and a staged row
//     leaves only by a committed delete. That is the new mark.
//
// A transaction open on the sequence (say an API request that staged a
// row and has not committed) holds the mark where it was until it ends,
// which is right: its row may commit late with a low id. A held snapshot
// that stages nothing (a report, pg_dump) holds nothing. The argument
// needs ids to come from the sequence; a sequence with CACHE > 1 (ids
// handed out later than the last value says) or no sequence at all turns
// the mark off, a sequence that went backwards (setval, TRUNCATE ...
// RESTART IDENTITY) resets it, and every lowwater.FullEvery-th sweep reads
// from the start of the index anyway, for rows inserted with explicit ids
// below the mark whose notification was also lost.

// markState is what one sweep leaves the next.
type markState struct {
	mark int64 // no staged row has an id below it (fullPass: unknown)
	// cand is the last value and lock holders read at an earlier sweep,
	// waiting for its holders to end; nil: none.
	cand *markCandidate
}

type markCandidate struct {
	last    int64    // the sequence's last value (0: none handed out)
	holders []string // virtual transaction ids holding a lock on it
}

// seqReading is what a sweep read of staged_jobs.id's sequence, before it
// reads the lowest staged id.
type seqReading struct {
	// usable: there is a sequence and its CACHE is 1, so the argument
	// holds; the candidate fields are read only then.
	usable bool
	markCandidate
}

// nextMark is one sweep's decision: from the state the previous sweep
// left (st) and this sweep's reading of the sequence (seq), it reads the
// lowest staged id from where the mark allows (read; from the start of
// the index when full, every lowwater.FullEvery-th sweep) and returns that id
// and the state for the next sweep. On a read error the state keeps what
// the reading alone decided (a mark the sequence no longer supports is
// dropped).
func nextMark(st markState, seq seqReading, full bool, read func(from int64) (*int64, error)) (markState, *int64, error) {
	candEnded := false // st.cand's holders have all ended
	switch {
	case !seq.usable:
		st = markState{mark: fullPass}
	case st.cand != nil && seq.last < st.cand.last:
		// The sequence went backwards: ids below the mark may come again.
		st = markState{mark: fullPass}
	default:
		candEnded = st.cand != nil && !slices.ContainsFunc(st.cand.holders, func(v string) bool {
			return slices.Contains(seq.holders, v)
		})
	}
	from := st.mark
	if full {
		from = fullPass
	}
	low, err := read(from)
	if err != nil {
		return st, nil, err
	}
	if full && low != nil && *low < st.mark {
		// A row below the mark: an id that did not come from the sequence.
		st.mark = *low
	}
	if !seq.usable {
		return st, low, nil
	}
	if candEnded {
		mark := st.cand.last + 1
		if low != nil {
			mark = min(mark, *low)
		}
		st.mark = max(st.mark, mark)
		st.cand = nil
	}
	if st.cand == nil {
		now := seq.markCandidate
		st.cand = &now
	}
	return st, low, nil
}

// Notification gaps (idemd_enqueuer_notification_gaps_total{reason}):
// signs that notifications are not telling the enqueuer where committed
// rows are. Both should stay at 0.
const (
	// GapSwept counts rows moved only because the sweep found them below
	// where this replica's notified drains had already taken rows, while
	// the listener was up: a lost notification, or rows another replica
	// had locked and then rolled back or died holding. (Rarely also a late
	// commit whose notification was still on its way at that instant.)
	GapSwept = "swept"
	// GapNoFloor counts notifications without the lowest id in their
	// payload (migration 00015 not applied, or a foreign NOTIFY on the
	// channel): each makes the next drain a full pass, which walks every
	// dead index entry again.
	GapNoFloor = "notification_without_floor"
)

// GapReasons lists every reason, each exported at 0 from the start.
var GapReasons = []string{GapSwept, GapNoFloor}

// gap counts n of reason and logs the first occurrence of each reason.
func (s *Service) gap(reason string, n int, fields ...zap.Field) {
	if n <= 0 {
		return
	}
	s.metrics.notificationGaps.WithLabelValues(reason).Add(float64(n))
	once := &s.gapLogged[0]
	msg := "rows were moved that no notification had reported: a notification was lost, or another replica rolled back or died holding them; the sweep moves such rows within --sweep-interval (logged once; idemd_enqueuer_notification_gaps_total{reason=\"swept\"} counts them)"
	if reason == GapNoFloor {
		once = &s.gapLogged[1]
		msg = "a notification on idemd_staged_jobs carries no lowest id (is migration 00015 applied?): drains woken by such notifications start at the beginning of staged_jobs and slow down while old snapshots keep dead rows (logged once; idemd_enqueuer_notification_gaps_total{reason=\"notification_without_floor\"} counts them)"
	}
	once.Do(func() { s.logger.Warn(msg, fields...) })
}
