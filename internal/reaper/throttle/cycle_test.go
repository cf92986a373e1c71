package throttle

import (
	"math"
	"testing"
	"time"
)

// defaults are PostgreSQL's checkpoint settings: a checkpoint requested
// after 512 MiB since the last redo, one due every 5 minutes.
var defaults = Checkpoints{MaxWALSize: 1 << 30, Timeout: 5 * time.Minute, CompletionTarget: 0.9, SegmentSize: 16 << 20}

const mib = 1 << 20

// The guard reads the cycle from the server: from the control file when
// its checkpoint is the cycle's, from the count of checkpoints begun
// when one begins, and from the control file again when that one
// completes.
func TestCycleFollowsTheServersCheckpoints(t *testing.T) {
	b := defaults.WALBudget()
	c := NewCycle(defaults, b)
	const redo = int64(1 << 32)
	// The last checkpoint began 100 s ago, 100 MiB ago; the API has
	// written 1 MiB/s since.
	c.Observe(Signals{At: t0, WALPosition: redo + 100*mib, CheckpointsBegun: 4, ControlRedo: redo, ControlAge: 100 * time.Second})
	c.Observe(Signals{At: t0.Add(2 * time.Second), WALPosition: redo + 102*mib, CheckpointsBegun: 4, ControlRedo: redo, ControlAge: 102 * time.Second})
	st := c.State(1)
	if st.Mode != CycleRoom || st.Since != 102*mib || st.Left != 198*time.Second || math.Abs(st.API-mib) > 1 {
		t.Fatalf("known cycle: %+v", st)
	}
	// 512 MiB request one; a round is reserved; the API will write 208
	// MiB, to the next checkpoint's due time and the margin past it.
	if want := defaults.RequestThreshold() - b.Batch - 102*mib - 208*mib; math.Abs(st.Room-want) > 1 {
		t.Fatalf("room %.0f, want %.0f", st.Room, want)
	}
	// A round's WAL is the run's, not the API's: the rate stays.
	c.Observe(Signals{At: t0.Add(3 * time.Second), WALPosition: redo + 112*mib, CheckpointsBegun: 4, ControlRedo: redo, ControlAge: 103 * time.Second, RoundWAL: 10 * mib})
	if st := c.State(1); math.Abs(st.API-mib) > 1 || c.run != 10*mib {
		t.Fatalf("after a round: %+v, run %.0f", st, c.run)
	}
	// A checkpoint begins: its redo is past the last reading's position,
	// which the guard takes; the next is due a timeout after now.
	at := t0.Add(200 * time.Second)
	c.Observe(Signals{At: at, WALPosition: redo + 300*mib, CheckpointsBegun: 5, ControlRedo: redo, ControlAge: 300 * time.Second})
	if c.redo != redo+112*mib || !c.start.Equal(at) || c.run != 0 || !c.known {
		t.Fatalf("a checkpoint began: redo %d start %s run %.0f", c.redo-redo, c.start, c.run)
	}
	// It completes: the control file has its exact redo and start.
	at = at.Add(270 * time.Second)
	c.Observe(Signals{At: at, WALPosition: redo + 400*mib, CheckpointsBegun: 5, ControlRedo: redo + 299*mib, ControlAge: 271 * time.Second})
	if c.redo != redo+299*mib || !c.start.Equal(at.Add(-271*time.Second)) || c.estimated {
		t.Fatalf("completed: redo %d start %s", c.redo-redo, c.start)
	}
	// A CHECKPOINT: it completes between two readings, and the count of
	// checkpoints rises just after, when the control file already has it.
	// One new cycle, with the exact redo.
	at = at.Add(10 * time.Second)
	c.Observe(Signals{At: at, WALPosition: redo + 420*mib, CheckpointsBegun: 5, ControlRedo: redo + 410*mib, ControlAge: time.Second})
	if c.redo != redo+410*mib || !c.start.Equal(at.Add(-time.Second)) || !c.hasPrev || c.prev != 101*mib {
		t.Fatalf("CHECKPOINT: redo %d start %s, the last cycle's API %.0f MiB", (c.redo-redo)/mib, c.start, c.prev/mib)
	}
	c.Observe(Signals{At: at.Add(time.Second), WALPosition: redo + 421*mib, CheckpointsBegun: 6, ControlRedo: redo + 410*mib, ControlAge: 2 * time.Second})
	if c.redo != redo+410*mib || c.begun != 6 {
		t.Fatalf("the count rising after the control file: redo %d", (c.redo-redo)/mib)
	}
}

// A run that starts while a checkpoint is in progress knows only the one
// before it: the checkpoint in progress is due on the schedule, and the
// WAL since the older redo stands in for the cycle's. When that leaves
// room (a quiet server), the run goes; when it does not, the run goes at
// the floor rather than wait on a figure that is not the cycle's.
func TestCycleStartingWhileACheckpointRuns(t *testing.T) {
	b := defaults.WALBudget()
	const redo = int64(1 << 32)
	quiet := NewCycle(defaults, b)
	quiet.Observe(Signals{At: t0, WALPosition: redo + 20*mib, CheckpointsBegun: 9, ControlRedo: redo, ControlAge: 400 * time.Second})
	quiet.Observe(Signals{At: t0.Add(time.Second), WALPosition: redo + 20*mib, CheckpointsBegun: 9, ControlRedo: redo, ControlAge: 401 * time.Second})
	if quiet.known || !quiet.start.Equal(t0.Add(-100*time.Second)) {
		t.Fatalf("in progress: known %v start %s", quiet.known, quiet.start)
	}
	if st := quiet.State(1); st.Mode != CycleRoom || st.Left != 199*time.Second {
		t.Fatalf("quiet server, checkpoint in progress: %+v", st)
	}
	busy := NewCycle(defaults, b)
	busy.Observe(Signals{At: t0, WALPosition: redo + 700*mib, CheckpointsBegun: 9, ControlRedo: redo, ControlAge: 400 * time.Second})
	busy.Observe(Signals{At: t0.Add(time.Second), WALPosition: redo + 701*mib, CheckpointsBegun: 9, ControlRedo: redo, ControlAge: 401 * time.Second})
	if st := busy.State(1); st.Mode != CycleFloor || st.APIFills {
		t.Fatalf("busy server, checkpoint in progress: %+v", st)
	}
}

// With the API filling the cycle by itself, the guard says so; with the
// cycle nearly full but the API alone under it, the run waits.
func TestCycleModes(t *testing.T) {
	b := defaults.WALBudget()
	const redo = int64(1 << 32)
	for _, tc := range []struct {
		name          string
		since, run    float64 // MiB
		api           float64 // MiB/s
		mode          CycleMode
		apiFills      bool
		roomAtLeastMB float64
	}{
		{name: "room", since: 100, api: 0.5, mode: CycleRoom, roomAtLeastMB: 250},
		{name: "full with the run's WAL", since: 420, run: 100, api: 0.5, mode: CycleFull},
		{name: "the API's projection fills it", since: 400, run: 10, api: 1, mode: CycleFloor},
		{name: "the API filled it", since: 515, run: 5, api: 0.1, mode: CycleFloor, apiFills: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := NewCycle(defaults, b)
			pos := redo + int64((tc.since-tc.run-tc.api*10)*mib)
			c.Observe(Signals{At: t0, WALPosition: pos, CheckpointsBegun: 1, ControlRedo: redo, ControlAge: 100 * time.Second})
			pos += int64(tc.api * 10 * mib)
			c.Observe(Signals{At: t0.Add(10 * time.Second), WALPosition: pos, CheckpointsBegun: 1, ControlRedo: redo, ControlAge: 110 * time.Second})
			pos += int64(tc.run * mib)
			c.Observe(Signals{At: t0.Add(10 * time.Second), WALPosition: pos, CheckpointsBegun: 1, ControlRedo: redo, ControlAge: 110 * time.Second, RoundWAL: int64(tc.run * mib)})
			st := c.State(350e3)
			if st.Mode != tc.mode || st.APIFills != tc.apiFills || (tc.mode == CycleRoom && st.Room < tc.roomAtLeastMB*mib) {
				t.Fatalf("mode %d room %.1f MiB api fills %v: %v", st.Mode, st.Room/mib, st.APIFills, st)
			}
		})
	}
}

// server simulates a primary's checkpoints for the throttle: a checkpoint
// begins every timeout or when the WAL since the last redo reaches the
// request threshold, and its redo and start reach the control file when
// it completes (at completion target of the timeout); the API writes
// burst bytes/s for burstFor after each checkpoint (the first change to
// each page logged whole) and quiet bytes/s after.
type server struct {
	c                    Checkpoints
	burst, quiet         float64
	burstFor             time.Duration
	now, begun, complete time.Time
	pos, redo            float64
	ctlRedo              float64
	ctlAt                time.Time
	count, requested     int64
	inProgress           bool
}

func newServer(c Checkpoints, burst, quiet float64, burstFor time.Duration) *server {
	s := &server{c: c, burst: burst, quiet: quiet, burstFor: burstFor, now: t0, pos: 1 << 32}
	s.begin(false)
	s.finish()
	return s
}

func (s *server) begin(requested bool) {
	if s.inProgress {
		s.finish() // a checkpoint requested while one runs makes it finish at once
	}
	s.redo, s.begun, s.inProgress = s.pos, s.now, true
	s.complete = s.now.Add(time.Duration(float64(s.c.Timeout) * s.c.CompletionTarget))
	s.count++
	if requested {
		s.requested++
	}
}

func (s *server) finish() { s.ctlRedo, s.ctlAt, s.inProgress = s.redo, s.begun, false }

// advance lets d pass, the API writing and the run writing run bytes
// spread over it, in steps of 100 ms.
func (s *server) advance(d time.Duration, run float64) {
	const step = 100 * time.Millisecond
	for left := d; left > 0; left -= step {
		dt := min(step, left)
		rate := s.quiet
		if s.now.Sub(s.begun) < s.burstFor {
			rate = s.burst
		}
		s.pos += rate*dt.Seconds() + run*float64(dt)/float64(d)
		s.now = s.now.Add(dt)
		switch {
		case s.pos-s.redo >= s.c.RequestThreshold():
			s.begin(true)
		case s.now.Sub(s.begun) >= s.c.Timeout:
			s.begin(false)
		case s.inProgress && !s.now.Before(s.complete):
			s.finish()
		}
	}
}

func (s *server) signals(roundWAL float64) Signals {
	return Signals{At: s.now, WALPosition: int64(s.pos), RoundWAL: int64(roundWAL),
		RequestedCheckpoints: s.requested, CheckpointsBegun: s.count,
		ControlRedo: int64(s.ctlRedo), ControlAge: s.now.Sub(s.ctlAt)}
}

// reap runs a wal_rate=auto run against s for d, with rounds that write
// what the throttle allows at 50 MB/s; guarded: with the cycle guard. It
// returns the run's WAL, its rounds, and the decisions that said the API
// fills the cycle.
func reap(s *server, d time.Duration, guarded bool) (wrote float64, apiFills int) {
	wrote, _, apiFills = reapRounds(s, d, guarded)
	return wrote, apiFills
}

func reapRounds(s *server, d time.Duration, guarded bool) (wrote float64, ws []write, apiFills int) {
	b := s.c.WALBudget()
	th := New(Limits{PauseMin: 100 * time.Millisecond, PauseMax: time.Second})
	th.Pace(NewBudgetPacer(b), true)
	th.WatchCheckpoints(s.requested)
	if guarded {
		th.GuardCycle(NewCycle(s.c, b))
	}
	end := s.now.Add(d)
	var round float64
	for s.now.Before(end) {
		dec := th.Decide(s.signals(round))
		round = 0
		if dec.Cycle.APIFills {
			apiFills++
		}
		if dec.Throttled() {
			s.advance(dec.Wait, 0)
			continue
		}
		round = th.RoundBytes()
		s.advance(time.Duration(round/50e6*float64(time.Second))+time.Millisecond, round)
		wrote += round
		ws = append(ws, write{s.now, int64(round)})
	}
	return wrote, ws, apiFills
}

// The guard keeps a run from making the server request checkpoints
// where the budget pacer alone does: an API whose images after each
// checkpoint fill most of a cycle (3.8 MiB/s for 85 s, as the standby
// suite's inserts into a 10M-key table write) and 0.2-0.6 MiB/s after,
// 366-452 MiB of the 512 a cycle holds; the run starting just after a
// checkpoint, late in a cycle, or while a checkpoint is in progress. The
// run still reaps: into the room the API leaves, spread over the cycle.
func TestCycleGuardKeepsCheckpointsUnrequested(t *testing.T) {
	const d = 30 * time.Minute
	bare := newServer(defaults, 3.8*mib, 0.5*mib, 85*time.Second)
	reap(bare, d, false)
	if bare.requested == 0 {
		t.Fatalf("the budget pacer alone made no checkpoint requested: the scenario does not test the guard")
	}
	for _, quiet := range []float64{0.2, 0.5, 0.6} {
		for _, late := range []time.Duration{0, 150 * time.Second, 280 * time.Second, 320 * time.Second} {
			s := newServer(defaults, 3.8*mib, quiet*mib, 85*time.Second)
			s.advance(late, 0)
			wrote, ws, fills := reapRounds(s, d, true)
			// Where the room binds (under the bucket's 107 MB), it is
			// spread over the cycle, not spent at once: the bucket alone
			// lets its depth through in one 10 s (10.7 MiB/s); a run that
			// starts late in a cycle spreads its room over the seconds
			// left and the margin.
			if most := maxWindowRate(ws, 10*time.Second); quiet >= 0.5 && most > 4*mib {
				t.Errorf("API at %.1f MiB/s, run %s into the cycle: the run wrote %.1f MiB/s over 10 s", quiet, late, most/mib)
			}
			if s.requested != 0 {
				t.Fatalf("API at %.1f MiB/s, run %s into the cycle: the server requested %d checkpoints (%d without the guard at 0.5 MiB/s)", quiet, late, s.requested, bare.requested)
			}
			// At least 10 MiB of room a cycle, and the API never said to
			// fill the cycle by itself.
			if wrote < 60*mib || fills != 0 {
				t.Fatalf("API at %.1f MiB/s, run %s into the cycle: the run wrote %.1f MiB in %s; decisions saying the API fills the cycle: %d", quiet, late, wrote/mib, d, fills)
			}
			t.Logf("API at %.1f MiB/s, run %s into the cycle: %.1f MiB in %s, 0 requested", quiet, late, wrote/mib, d)
		}
	}
}

// An API that alone writes more than a cycle holds (1.5 MiB/s after its
// images: 645 MiB a cycle) makes the server request checkpoints whatever
// the run does: the guard says so and the run goes on at the floor.
func TestCycleGuardGoesAtTheFloorWhenTheAPIFillsTheCycle(t *testing.T) {
	const d = 30 * time.Minute
	s := newServer(defaults, 3.8*mib, 1.5*mib, 85*time.Second)
	wrote, fills := reap(s, d, true)
	floor := defaults.WALBudget().Rate / pacerFloorShare
	if fills == 0 {
		t.Fatal("the guard never said the API fills the cycle")
	}
	// The floor halves once per requested checkpoint the run sees (down
	// to its own floor): at least an eighth of the floor's WAL.
	if wrote < floor/8*d.Seconds() {
		t.Fatalf("the run wrote %.1f MiB in %s with the API filling the cycle; the floor is %.2f MiB/s", wrote/mib, d, floor/mib)
	}
}

// Decide with the guard: a round is capped to the cycle's room; a cycle
// the run's own WAL filled holds the run (paced time, rechecked every
// CycleRecheck); one the API fills lets the run go at the floor.
func TestDecideGuardsTheCycle(t *testing.T) {
	b := defaults.WALBudget()
	const redo = int64(1 << 32)
	newThrottle := func() *Throttle {
		th := New(Limits{PauseMin: 100 * time.Millisecond, PauseMax: time.Second})
		th.Pace(NewBudgetPacer(Budget{Rate: b.Rate, Depth: b.Depth, Batch: b.Batch, Initial: b.Depth}), true)
		th.GuardCycle(NewCycle(defaults, b))
		return th
	}
	sig := func(at time.Duration, pos float64, round float64) Signals {
		return Signals{At: t0.Add(at), WALPosition: redo + int64(pos*mib), RoundWAL: int64(round * mib),
			CheckpointsBegun: 1, ControlRedo: redo, ControlAge: 100*time.Second + at}
	}
	// 481 MiB since the redo, the API at 0.1 MiB/s for the 190 s left:
	// 19 MiB, so about 5 MiB of room, less than the pacer's largest round.
	th := newThrottle()
	th.Decide(sig(0, 480, 0))
	d := th.Decide(sig(10*time.Second, 481, 0))
	if d.Throttled() || d.Cycle.Mode != CycleRoom || th.RoundBytes() != d.Cycle.Room || d.Cycle.Room >= b.Batch {
		t.Fatalf("little room: %+v, round %.0f", d, th.RoundBytes())
	}
	// The run's round fills it: held, as paced time.
	d = th.Decide(sig(10*time.Second+100*time.Millisecond, 481+d.Cycle.Room/mib, d.Cycle.Room/mib))
	if d.Wait != CycleRecheck || !d.Paced || !d.CycleFull || d.Reason != ReasonWALRate {
		t.Fatalf("full by the run's WAL: %+v", d)
	}
	// The API fills it (2 MiB/s for the 190 s left): a round at the
	// floor, and after it the wait the round takes at the floor.
	th = newThrottle()
	th.Decide(sig(0, 400, 0))
	if d := th.Decide(sig(10*time.Second, 420, 0)); d.Throttled() || d.Cycle.Mode != CycleFloor || th.RoundBytes() != th.Pacer().MinRound() {
		t.Fatalf("filled by the API: %+v, round %.0f", d, th.RoundBytes())
	}
	round := th.Pacer().MinRound() / mib
	d = th.Decide(sig(10*time.Second+10*time.Millisecond, 420+round, round))
	if want := time.Duration(float64(int64(round*mib)) / th.Pacer().Floor() * float64(time.Second)); d.Cycle.Mode != CycleFloor || !near(d.Wait, want) || !d.Paced {
		t.Fatalf("after a round at the floor: %+v, want a wait of %s", d, want)
	}
}
