package throttle

import (
	"fmt"
	"math"
	"time"
)

// Cycle is wal_rate=auto's guard on the server's checkpoint cycle: the WAL
// written since the current checkpoint's redo, plus what the API will
// write until the next checkpoint is due by checkpoint_timeout, plus the
// run's next round, must stay under the WAL that makes the server request
// a checkpoint (RequestThreshold). The budget pacer alone bounds the
// server's WAL over any checkpoint_timeout only while the API writes less
// than its rate; an API that writes every index page it touches whole
// after each checkpoint (a large key table, random keys) can fill most of
// a cycle by itself, and the bucket's depth spent on top of it early in
// the cycle then makes the server request the next checkpoint. The guard
// lets the run write only into the room the API leaves, which is known
// late in a cycle: the run's WAL moves from the start of a cycle, where
// the API's images are, to its end.
//
// The current cycle is read from the server. The count of checkpoints
// begun (timed and requested) rises within a second of a checkpoint's
// start, and the WAL position read just before the rise is a lower bound
// of its redo; the control file (pg_control_checkpoint()) holds a
// checkpoint only once it completes (checkpoint_completion_target of the
// cycle later), with its exact redo and start time, which the guard then
// takes. A run that starts while a checkpoint is in progress knows only
// the one before it: until that one completes, its redo stands in. The
// WAL since it is more than the cycle's, so the room is smaller than
// there is; when it leaves none, the run goes at the pacer's floor
// rather than be held on a figure that is not the cycle's.
//
// What the API will write until the next checkpoint is projected two
// ways, and the larger taken. Its rate now: the server's WAL rate over
// the intervals in which no round ran (the run's waits), smoothed over
// cycleSmoothing; after a checkpoint it is high (the images) and it
// falls, so it errs on the side of the threshold. And the rest of what
// it wrote over the last whole cycle the run saw: a rate read at the
// end of a cycle knows nothing of the images the next one begins with.
//
// When the room is less than a round the guard tells apart who filled
// the cycle, on the likelier projection (the last whole cycle's, once
// the run saw one). The run's own WAL: it waits (CycleFull), for the
// API's rate to fall or the next checkpoint. The API's (its projection
// alone leaves no room): a checkpoint will be requested with or without
// the run, which goes on at the pacer's floor rather than stop
// (CycleFloor); the guard says the API fills the cycle (APIFills) once a
// whole cycle, or this one's WAL so far, shows it.
//
// Pure: the caller passes every reading. Not safe for concurrent use.
type Cycle struct {
	threshold float64
	// reserve is kept free of the projection: one of the budget's largest
	// rounds, for a round whose WAL per key is larger than the last (a
	// page's first change after a checkpoint is logged whole).
	reserve float64
	timeout time.Duration

	started bool
	begun   int64 // checkpoints begun, at the last reading
	// redo is the cycle's redo position (bytes from 0/0) and start when
	// its checkpoint began; known: redo is this cycle's (exact, or the
	// position just before its checkpoint began), not the previous one's
	// standing in.
	redo  int64
	start time.Time
	known bool
	// estimated: redo is a lower bound (the position before the count of
	// checkpoints rose) until the control file has the checkpoint; ctl is
	// the control file's redo last seen.
	estimated bool
	ctl       int64
	// recent are the readings of the last cycleReported, for the
	// position before a checkpoint began.
	recent []mark
	// run is the WAL of the run's rounds in this cycle, lastRun in the
	// one before.
	run, lastRun float64
	// share is the run's credit of the room (Observe), bytes; negative:
	// owed.
	share float64
	// api is the API's WAL rate, bytes per second, once measured.
	api    float64
	hasAPI bool
	// prev is the API's WAL over the last whole cycle the run saw end
	// (hasPrev): the WAL from its redo to the next checkpoint's, less the
	// run's.
	prev    float64
	hasPrev bool
	at      time.Time
	pos     int64
}

// cycleSmoothing is the time constant of the API's smoothed WAL rate: a
// few of the run's waits, so one burst moves it and a fall shows within
// seconds.
const cycleSmoothing = 10 * time.Second

// cycleReported is how long after a checkpoint began its count may be
// seen to rise: a spread checkpoint reports it within a second, an
// immediate one as it ends; the redo is taken from a reading this much
// older, which overstates the cycle's WAL by what the server writes in it.
const cycleReported = 5 * time.Second

// mark is a reading's time and WAL position.
type mark struct {
	at  time.Time
	pos int64
}

// cycleMargin is the most time the guard allows past the next
// checkpoint's due time (margin).
const cycleMargin = 10 * time.Second

// CycleRecheck is how long a run held by a full cycle waits before it
// reads the server again: the room opens as the API's rate falls or when
// the next checkpoint begins, which a second's delay costs little of.
const CycleRecheck = time.Second

// NewCycle returns the guard for the server's settings, with b's largest
// round as its reserve; nil when a setting is unknown.
func NewCycle(c Checkpoints, b Budget) *Cycle {
	v := c.RequestThreshold()
	if v <= 0 || c.Timeout <= 0 {
		return nil
	}
	return &Cycle{threshold: v, reserve: b.Batch, timeout: c.Timeout}
}

// Observe takes a reading: its WAL position, the checkpoints begun and
// the control file's last checkpoint (s.ControlRedo, s.ControlAge), and
// the previous round's WAL (s.RoundWAL; 0: no round since the last
// reading, so the interval's WAL is the API's).
func (c *Cycle) Observe(s Signals) {
	if !c.started {
		c.started = true
		c.begun, c.redo, c.ctl = s.CheckpointsBegun, s.ControlRedo, s.ControlRedo
		began := s.At.Add(-s.ControlAge)
		if s.ControlAge < c.timeout {
			c.start, c.known = began, true
		} else {
			// A checkpoint began after the control file's, and is in
			// progress (or was skipped on an idle server): due on the
			// schedule, its redo unknown.
			c.start = began.Add(time.Duration(s.ControlAge/c.timeout) * c.timeout)
		}
		c.at, c.pos = s.At, s.WALPosition
		c.recent = append(c.recent, mark{s.At, s.WALPosition})
		return
	}
	if s.ControlRedo > c.ctl {
		// A checkpoint completed: the control file has its exact redo and
		// start. It is the cycle's own checkpoint when the cycle's redo
		// was an estimate or a stand-in; otherwise one that began and
		// completed between two readings (a CHECKPOINT), a new cycle.
		c.ctl = s.ControlRedo
		if c.estimated || !c.known {
			c.redo, c.start = s.ControlRedo, s.At.Add(-s.ControlAge)
		} else {
			c.next(s.ControlRedo, s.At.Add(-s.ControlAge))
		}
		c.known, c.estimated = true, false
	}
	if s.CheckpointsBegun > c.begun {
		// A checkpoint began. Its redo is past the position
		// cycleReported before now (the count rises within a second of a
		// spread checkpoint's start, just after an immediate one's end);
		// its start is taken as now, so the next is due no earlier than
		// it is. Unless that position is not past the cycle's redo: then
		// the control file already showed this checkpoint.
		c.begun = s.CheckpointsBegun
		if before := c.before(s.At.Add(-cycleReported)); before > c.redo {
			c.next(before, s.At)
			c.known, c.estimated = true, true
		}
	}
	dt := s.At.Sub(c.at).Seconds()
	switch {
	case s.RoundWAL > 0:
		c.run += float64(s.RoundWAL)
	case dt > 0 && s.WALPosition >= c.pos:
		rate := float64(s.WALPosition-c.pos) / dt
		if !c.hasAPI {
			c.api, c.hasAPI = rate, true
		} else {
			c.api += (1 - math.Exp(-dt/cycleSmoothing.Seconds())) * (rate - c.api)
		}
	}
	c.at, c.pos = s.At, max(c.pos, s.WALPosition)
	// The run's share of the room: a bucket of one largest round that
	// fills at the rate spending the room (as this reading has it) by the
	// checkpoint's due time, and that each round's WAL is charged to
	// (State's Spread).
	if dt > 0 {
		c.share = min(c.share+c.figures().spread*dt, c.reserve)
	}
	c.share -= float64(s.RoundWAL)
	c.recent = append(c.recent, mark{s.At, c.pos})
	for len(c.recent) > 1 && s.At.Sub(c.recent[1].at) > cycleReported {
		c.recent = c.recent[1:]
	}
}

// next starts a new cycle at redo and start, and keeps what the API
// wrote in the one that ended (when the cycle's redo was its own).
func (c *Cycle) next(redo int64, start time.Time) {
	if c.known {
		c.prev, c.hasPrev = max(float64(c.pos-c.redo)-c.run, 0), true
	}
	c.lastRun = c.run
	c.redo, c.start, c.run, c.share = redo, start, 0, 0
}

// before is the WAL position at the latest reading no later than at (the
// oldest kept when none is).
func (c *Cycle) before(at time.Time) int64 {
	pos := c.recent[0].pos
	for _, m := range c.recent {
		if m.at.After(at) {
			break
		}
		pos = m.pos
	}
	return pos
}

// CycleMode is what the guard lets the next round do.
type CycleMode int

const (
	// CycleRoom: the round may write up to Room.
	CycleRoom CycleMode = iota
	// CycleFull: the room left is less than a round, and the run's own
	// WAL filled it: the run waits for it to open (the API's rate
	// falling, or the next checkpoint).
	CycleFull
	// CycleFloor: the API alone will fill the cycle by its projection (a
	// checkpoint is requested with or without the run), or the cycle's
	// redo is not known yet: the run goes at the pacer's floor, so it
	// never stops.
	CycleFloor
)

// CycleState is the guard's reading of the cycle for the next round.
type CycleState struct {
	Mode CycleMode
	// Room is the WAL the run may write before the next checkpoint is due
	// without the server requesting one sooner.
	Room float64
	// Since is the WAL since the cycle's redo, API the API's rate, Left
	// the time until the next checkpoint is due, Threshold the WAL that
	// requests one: the figures behind the mode, for the log.
	Since, API, Threshold float64
	Left                  time.Duration
	// APIFills: the API alone fills the cycle, shown by a whole cycle or
	// by this one's WAL so far (CycleFloor).
	APIFills bool
	// Spread is how long the run should wait for its WAL so far to be
	// spread over the rest of the cycle at the rate that spends the room
	// by the time the next checkpoint is due (CycleRoom; Throttle waits
	// it only where the room, not the bucket, binds the run).
	Spread time.Duration
}

// State is the guard's reading at the last observation; a round smaller
// than minRound is no round.
func (c *Cycle) State(minRound float64) CycleState {
	f := c.figures()
	st := CycleState{Since: f.since, API: f.api, Left: f.left, Threshold: c.threshold, Room: f.room}
	switch {
	case st.Room >= minRound:
		// With the stand-in redo too: the WAL since it is more than the
		// cycle's, so the room is less than there is.
		if c.share < 0 && f.spread > 0 {
			st.Spread = time.Duration(-c.share / f.spread * float64(time.Second))
		}
	case !c.known || f.since-c.run+f.likely >= c.threshold-c.reserve:
		full := c.threshold - c.reserve
		st.Mode = CycleFloor
		st.APIFills = c.known && ((c.hasPrev && c.prev >= full) || f.since-c.run >= full)
	default:
		st.Mode = CycleFull
	}
	return st
}

// cycleFigures are the guard's figures at the last reading.
type cycleFigures struct {
	since, api, room float64
	// likely is the API's likelier projection (State), spread the rate
	// that spends the room by the time the next checkpoint is due.
	likely, spread float64
	left           time.Duration
}

func (c *Cycle) figures() cycleFigures {
	f := cycleFigures{since: float64(c.pos - c.redo), left: max(c.start.Add(c.timeout).Sub(c.at), 0)}
	f.api = c.api
	if !c.hasAPI {
		// No quiet interval yet: the cycle's average so far, which the
		// images after its checkpoint make high.
		f.api = max(f.since-c.run, 0) / max(c.at.Sub(c.start).Seconds(), 1)
	}
	// The API goes on writing if the checkpoint begins late (the
	// checkpointer wakes on whole seconds; the control file's time is in
	// whole seconds; a counted start is the reading's): a margin of time.
	until := (f.left + c.margin()).Seconds()
	// The room takes the larger projection; who fills the cycle is judged
	// on the likelier one, the last whole cycle's when the run saw one:
	// the rate during the images after a checkpoint, held until the next,
	// would blame the API for most cycles it leaves room in, and the
	// run's WAL at the floor would fill that room.
	projected := f.api * until
	f.likely = projected
	if c.hasPrev {
		f.likely = max(c.prev-(f.since-c.run), 0)
		projected = max(projected, f.likely)
	}
	f.room = c.threshold - c.reserve - f.since - projected
	f.spread = max(f.room, 0) / until
	return f
}

// margin is the time the guard allows past the next checkpoint's due
// time: a tenth of checkpoint_timeout, at most cycleMargin.
func (c *Cycle) margin() time.Duration { return min(c.timeout/10, cycleMargin) }

// String renders the state for the log.
func (s CycleState) String() string {
	return fmt.Sprintf("%s since the last checkpoint's redo, the API writing %s/s for the %s until the next is due, of the %s that make the server request one",
		humanBytes(s.Since), humanBytes(s.API), s.Left.Round(time.Second), humanBytes(s.Threshold))
}
