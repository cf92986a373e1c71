package enqueuer

import (
	"math"
	"sync"

	"go.uber.org/zap"
)

// Where a drain starts, and why it still finds every committed row.
//
// Every row the enqueuer moves leaves a dead entry in staged_jobs_pkey until
// VACUUM removes it, and VACUUM cannot while any transaction holds a
// snapshot older than the delete. A take that starts at the lowest id walks
// all of those entries, so its cost grew with the age of the oldest
// snapshot (issue 16). A drain therefore starts at a floor: the lowest id
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
//     notification with no number in it (the trigger before 00015): a
//     full pass, from the start of the index. A
//     reconnect's full pass finds the rows whose notifications were lost
//     while the listener was down (it begins after LISTEN is back, so
//     anything committed later notifies again); a retry's finds the rows
//     of the failed drain.
//   - The sweep, every PollInterval on its own connection (sweep.go): a
//     plain read of the lowest committed id (it sees rows other
//     transactions hold locked, too). It lowers the floor to that id and
//     wakes the loop. It covers everything a notification can miss while
//     the listener looks healthy: rows another replica had locked (so our
//     drain skipped them) and then rolled back, a replica killed
//     mid-batch, a notification lost for any other reason; and, with no
//     listener (--poll-only, or a listener that is down), it is the only
//     wake-up, so a row waits at most about one PollInterval, as before.
//     The sweep reads from a low-water mark below which no row can exist
//     or appear, so it too skips the dead entries; every sweepFullEvery-th
//     sweep reads from the start of the index, off the move path (it holds
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
}

func newFloor() *floor { return &floor{notified: noFloor, swept: noFloor} }

// lower records that a drain must start at or below id.
func (f *floor) lower(id int64) {
	f.mu.Lock()
	f.notified = min(f.notified, id)
	f.mu.Unlock()
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
	f.notified, f.swept, f.sweptListening, f.untilEmpty = noFloor, noFloor, false, false
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
	msg := "rows were moved that no notification had reported: a notification was lost, or another replica rolled back or died holding them; the sweep moves such rows within --poll-interval (logged once; idemd_enqueuer_notification_gaps_total{reason=\"swept\"} counts them)"
	if reason == GapNoFloor {
		once = &s.gapLogged[1]
		msg = "a notification on idemd_staged_jobs carries no lowest id (is migration 00015 applied?): drains woken by such notifications start at the beginning of staged_jobs and slow down while old snapshots keep dead rows (logged once; idemd_enqueuer_notification_gaps_total{reason=\"notification_without_floor\"} counts them)"
	}
	once.Do(func() { s.logger.Warn(msg, fields...) })
}
