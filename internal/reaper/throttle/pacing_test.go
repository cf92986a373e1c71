package throttle

import (
	"errors"
	"math"
	"slices"
	"testing"
	"time"
)

var t0 = time.Date(2026, 12, 7, 10, 0, 0, 0, time.UTC)

// pacedRun drives a pacer the way a run does, with an injected clock: a
// round of the given bytes, which takes roundTime, whenever the pacer
// lets one start. It returns the bytes written at each moment.
type write struct {
	at    time.Time
	bytes int64
}

func pacedRun(p *WALPacer, rounds int, bytes func(i int) int64, roundTime time.Duration) []write {
	now := t0
	var ws []write
	pos := int64(1 << 30)
	p.Observe(now, pos)
	for i := range rounds {
		now = now.Add(p.Wait(now))
		if p.Wait(now) != 0 {
			panic("the pacer's wait did not suffice")
		}
		b := bytes(i)
		now = now.Add(roundTime)
		ws = append(ws, write{now, b})
		pos += b
		p.Observe(now, pos)
	}
	return ws
}

// maxWindowRate is the highest WAL rate over any window of w ending at a
// write (the windows that hold the most).
func maxWindowRate(ws []write, w time.Duration) float64 {
	best := 0.0
	for i, end := range ws {
		if end.at.Sub(ws[0].at) < w {
			continue // the run's first window is not w long yet
		}
		var sum int64
		for j := i; j >= 0 && end.at.Sub(ws[j].at) < w; j-- {
			sum += ws[j].bytes
		}
		best = max(best, float64(sum)/w.Seconds())
	}
	return best
}

// Rounds within BatchBytes keep every 10 s window within 10 % of the rate,
// whatever their size and however fast they run, and the run as a whole at
// the rate (the pacer waits no longer than the WAL takes).
func TestWALPacerHoldsTheRateOverTenSeconds(t *testing.T) {
	const rate = 3 << 20
	for _, tc := range []struct {
		name      string
		bytes     func(p *WALPacer) func(int) int64
		roundTime time.Duration
	}{
		{"full rounds, instant", func(p *WALPacer) func(int) int64 {
			return func(int) int64 { return int64(p.BatchBytes()) }
		}, 0},
		{"full rounds of 50ms", func(p *WALPacer) func(int) int64 {
			return func(int) int64 { return int64(p.BatchBytes()) }
		}, 50 * time.Millisecond},
		{"uneven rounds", func(p *WALPacer) func(int) int64 {
			return func(i int) int64 { return int64(p.BatchBytes()) * int64(1+i%4) / 4 }
		}, 10 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := NewWALPacer(rate)
			ws := pacedRun(p, 400, tc.bytes(p), tc.roundTime)
			if got := maxWindowRate(ws, 10*time.Second); got > 1.1*rate {
				t.Errorf("a 10 s window at %.0f B/s, over 1.1× %d", got, rate)
			}
			var total int64
			for _, w := range ws {
				total += w.bytes
			}
			overall := float64(total) / ws[len(ws)-1].at.Sub(t0).Seconds()
			if overall < 0.9*rate || overall > 1.1*rate {
				t.Errorf("the run's rate %.0f B/s, want within 10 %% of %d", overall, rate)
			}
		})
	}
}

// A round is followed by the time its WAL takes at the rate, less the
// bucket's small depth, and an idle pacer gathers no more than that depth.
func TestWALPacerWaitsWhatTheBytesTake(t *testing.T) {
	p := NewWALPacer(1 << 20) // 1 MB/s
	pos := int64(5 << 30)
	p.Observe(t0, pos)
	if w := p.Wait(t0); w != 0 {
		t.Fatalf("first round waits %s", w)
	}
	pos += 2 << 20
	p.Observe(t0, pos)
	want := 2*time.Second - pacerDepth
	if w := p.Wait(t0); w != want {
		t.Fatalf("after 2 MB: wait %s, want %s", w, want)
	}
	if w := p.Wait(t0.Add(time.Second)); !near(w, want-time.Second) {
		t.Fatalf("a second later: wait %s, want %s", w, want-time.Second)
	}
	// An hour idle: the credit is the depth, not an hour's rate.
	later := t0.Add(time.Hour)
	pos += 1 << 20
	p.Observe(later, pos)
	if w := p.Wait(later); w != time.Second-pacerDepth {
		t.Fatalf("after an idle hour and 1 MB: wait %s, want %s", w, time.Second-pacerDepth)
	}
	// A minute of an API writing 100 MB: owed is at most the 10 s window.
	pos += 100 << 20
	p.Observe(later.Add(time.Minute), pos)
	if w := p.Wait(later.Add(time.Minute)); w != pacerMaxDebt {
		t.Fatalf("after 100 MB in a minute at 1 MB/s: wait %s, want %s", w, pacerMaxDebt)
	}
}

// Halving slows the pacer to its floor and no further.
func TestWALPacerHalves(t *testing.T) {
	p := NewWALPacer(8 << 20)
	var rates []float64
	for p.Halve() {
		rates = append(rates, p.Rate())
	}
	want := []float64{4 << 20, 2 << 20, 1 << 20}
	if len(rates) != len(want) {
		t.Fatalf("rates %v, want %v", rates, want)
	}
	for i := range want {
		if rates[i] != want[i] {
			t.Fatalf("rates %v, want %v", rates, want)
		}
	}
	if p.BatchBytes() != float64(1<<20)*pacerBatch.Seconds() {
		t.Fatalf("BatchBytes %f at 1 MB/s", p.BatchBytes())
	}
}

func TestCheckpointsWALBudget(t *testing.T) {
	// PostgreSQL's defaults: a checkpoint is requested after 32
	// segments of WAL (64 / 1.9 = 33, less one).
	def := Checkpoints{MaxWALSize: 1 << 30, Timeout: 5 * time.Minute, CompletionTarget: 0.9, SegmentSize: 16 << 20}
	const v = float64(512 << 20)
	if got := def.RequestThreshold(); got != v {
		t.Errorf("default server's threshold %f, want 512 MiB", got)
	}
	b := def.WALBudget()
	if b.Depth != v/5 || b.Batch != v/80 || b.Initial != b.Depth {
		t.Errorf("default server's budget %+v: want a fifth of 512 MiB deep, rounds of a sixteenth of that, starting full", b)
	}
	// Depth, one round and the rate over checkpoint_timeout are the
	// threshold, all of it.
	if got := b.Depth + b.Batch + b.Rate*300; math.Abs(got-v) > 1 {
		t.Errorf("depth + round + rate·timeout = %f, want the threshold %f", got, v)
	}
	if b.Rate < 1.40e6 || b.Rate > 1.42e6 {
		t.Errorf("default server's rate %f, want 1.41 MB/s", b.Rate)
	}
	// WAL since the last checkpoint's redo is taken from the depth.
	def.SinceRedo = 100 << 20
	if got := def.WALBudget().Initial; got != v/5-100<<20 {
		t.Errorf("after 100 MiB of the cycle the run starts with %f", got)
	}
	def.SinceRedo = 400 << 20
	if got := def.WALBudget().Initial; got != 0 {
		t.Errorf("after 400 MiB of the cycle the run starts with %f, want 0", got)
	}
	// The suite's sized server: max_wal_size 8GB, checkpoint_timeout
	// 15min: 512 / 1.9 = 269 segments, less one.
	sized := Checkpoints{MaxWALSize: 8 << 30, Timeout: 15 * time.Minute, CompletionTarget: 0.9, SegmentSize: 16 << 20}
	if got := sized.RequestThreshold(); got != 268*16<<20 {
		t.Errorf("sized server's threshold %f, want 268 segments", got)
	}
	// The smallest max_wal_size: two segments, 2 / 1.9 is one, less one
	// is none: a segment.
	small := Checkpoints{MaxWALSize: 32 << 20, Timeout: 30 * time.Second, CompletionTarget: 0.9, SegmentSize: 16 << 20}
	if got := small.RequestThreshold(); got != 16<<20 {
		t.Errorf("smallest threshold %f, want a segment", got)
	}
	if got := (Checkpoints{}).WALBudget(); got != (Budget{}) {
		t.Errorf("unknown settings' budget %+v, want none", got)
	}
}

// serverRun drives a budget pacer as a run does beside an API, with an
// injected clock: rounds of up to the pacer's BatchBytes that take
// roundTime, whenever it lets one start, until total bytes are written;
// the API writes api bytes per second all along. It returns the server's
// writes (the API's at each decision) and how long the pacer held the run.
func serverRun(p *WALPacer, total int64, roundTime time.Duration, api float64) (ws []write, held time.Duration) {
	now := t0
	pos := int64(1 << 30)
	p.Observe(now, pos)
	for total > 0 {
		if w := p.Wait(now); w > 0 {
			held += w
			b := int64(api * w.Seconds())
			now = now.Add(w)
			pos += b
			ws = append(ws, write{now, b})
			p.Observe(now, pos)
			continue
		}
		b := min(int64(p.BatchBytes()), total)
		total -= b
		b += int64(api * roundTime.Seconds())
		now = now.Add(roundTime)
		pos += b
		ws = append(ws, write{now, b})
		p.Observe(now, pos)
	}
	return ws, held
}

// wal_rate=auto keeps the server's WAL over every checkpoint_timeout under
// what makes PostgreSQL request a checkpoint, whatever the run's size and
// the API's share, and lets a run whose WAL fits the bucket go at full
// speed: the sized server's runs are not paced. (The pacer before the
// bucket was deep held every run at 0.8 of the threshold per timeout,
// from its first round: a 190 MB reap on a server with a 4.3 GB threshold
// waited 46 s.)
func TestBudgetPacerKeepsCheckpointsOnSchedule(t *testing.T) {
	def := Checkpoints{MaxWALSize: 1 << 30, Timeout: 5 * time.Minute, CompletionTarget: 0.9, SegmentSize: 16 << 20}
	v := def.RequestThreshold()
	for _, tc := range []struct {
		name      string
		total     int64
		roundTime time.Duration
		api       float64
	}{
		{"1 GB, instant rounds", 1 << 30, 0, 0},
		{"2 GB, 100 ms rounds", 2 << 30, 100 * time.Millisecond, 0},
		{"1 GB beside an API at 300 kB/s", 1 << 30, 20 * time.Millisecond, 300e3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ws, _ := serverRun(NewBudgetPacer(def.WALBudget()), tc.total, tc.roundTime, tc.api)
			// The heaviest window of checkpoint_timeout, from any write on.
			var worst float64
			for i := range ws {
				var sum int64
				for j := i; j < len(ws) && ws[j].at.Sub(ws[i].at) < def.Timeout; j++ {
					sum += ws[j].bytes
				}
				worst = max(worst, float64(sum))
			}
			if worst > v {
				t.Errorf("%.0f bytes in one checkpoint_timeout, over the %.0f that request a checkpoint", worst, v)
			}
			// And the run is not slower than the rate needs: the API's
			// WAL is charged to the same bucket.
			if took, r := ws[len(ws)-1].at.Sub(t0).Seconds(), def.WALBudget().Rate-tc.api; took > float64(tc.total)/r*1.01 {
				t.Errorf("%d bytes took %.0f s at %.0f B/s", tc.total, took, r)
			}
		})
	}
	// A run within the depth is never held.
	sized := Checkpoints{MaxWALSize: 8 << 30, Timeout: 15 * time.Minute, CompletionTarget: 0.9, SegmentSize: 16 << 20}
	if _, held := serverRun(NewBudgetPacer(sized.WALBudget()), 200e6, 10*time.Millisecond, 300e3); held != 0 {
		t.Errorf("a 200 MB run on the sized server held %s", held)
	}
	if _, held := serverRun(NewBudgetPacer(def.WALBudget()), 100e6, 10*time.Millisecond, 0); held != 0 {
		t.Errorf("a 100 MB run on the default server held %s", held)
	}
	// A run late in a cycle has only what is left of it.
	late := def
	late.SinceRedo = v / 5
	if _, held := serverRun(NewBudgetPacer(late.WALBudget()), 100e6, 10*time.Millisecond, 0); held == 0 {
		t.Errorf("a 100 MB run after a fifth of the threshold was not held")
	}
}

// round is a round's probes: quiet commits and one slow one.
func round(quiet, slow time.Duration) RoundProbes {
	return SummarizeProbes([]time.Duration{quiet, quiet, quiet, quiet, slow})
}

// The sizer's moves on a trace of rounds: it cuts by the overshoot of the
// round's slowest probe (at least halving, at most to an eighth, never
// under its floor), adds a twentieth of its range on a round whose slowest
// probe is under half the budget, up to its ceiling, and holds in between.
func TestSizerAIMD(t *testing.T) {
	const budget = 4 * time.Millisecond
	ms := time.Millisecond
	for _, c := range []struct {
		name  string
		trace []RoundProbes
		want  []int
	}{
		{"grows while well under", []RoundProbes{round(ms, ms), round(ms, 2*ms), {}}, []int{2000, 3500, 3500}},
		{"holds between half and the budget", []RoundProbes{round(ms, ms), round(ms, 3*ms), round(ms, 4*ms)}, []int{2000, 2000, 2000}},
		{"halves on a small overshoot", []RoundProbes{round(ms, ms), round(ms, ms), round(ms, 5*ms)}, []int{2000, 3500, 1750}},
		{"cuts by the overshoot", []RoundProbes{round(ms, ms), round(ms, ms), round(ms, 10*ms)}, []int{2000, 3500, 1400}},
		{"at most to an eighth", []RoundProbes{round(ms, ms), round(ms, ms), round(ms, time.Second)}, []int{2000, 3500, 500}},
		{"a slow median is over too", []RoundProbes{round(ms, ms), round(8*ms, 8*ms)}, []int{2000, 1000}},
		{"never under the floor", []RoundProbes{round(ms, 5*ms), round(ms, 5*ms)}, []int{500, 500}},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := NewSizer(MinBatch, 30500, MinBatch)
			var got []int
			for _, r := range c.trace {
				s.Observe(r, budget)
				got = append(got, s.Size())
			}
			if !slices.Equal(got, c.want) {
				t.Fatalf("sizes %v, want %v", got, c.want)
			}
		})
	}
	s := NewSizer(MinBatch, 30500, MinBatch)
	if !s.AtMin() {
		t.Fatal("at the floor: AtMin false")
	}
	for range 40 {
		s.Observe(round(ms, ms), budget)
	}
	if s.Size() != 30500 {
		t.Fatalf("after 40 rounds under the budget: %d, want the ceiling", s.Size())
	}
	if got := s.Cap(2000); got != 2000 {
		t.Fatalf("Cap(2000) = %d", got)
	}
	if got := s.Cap(10); got != MinBatch {
		t.Fatalf("Cap(10) = %d, want the floor", got)
	}
	// A --batch-size under the floor is the floor.
	if small := NewSizer(MinBatch, 10, MinBatch); small.Size() != 10 || !small.AtMin() {
		t.Fatalf("batch size 10: %d", small.Size())
	}
	// Without a budget nothing moves.
	s.Observe(round(time.Hour, time.Hour), 0)
	if s.Size() != 30500 {
		t.Fatalf("no budget moved the size to %d", s.Size())
	}
}

// The budget bounds the tail: a server on which a batch's last WAL makes
// one commit in five wait in proportion to the batch (the API's commits
// behind its flush) while the others stay quiet. The round's median stays
// at the quiet commit whatever the size, so a sizer on the median grows
// to --batch-size and the slow fifth waits twice the budget; the sizer
// must keep every round's slowest probe within the budget once it has
// settled, without collapsing to its floor.
func TestSizerBoundsTheTail(t *testing.T) {
	const (
		budget = 4 * time.Millisecond
		quiet  = time.Millisecond
		perKey = 200 * time.Nanosecond // 15,000 keys: the budget
	)
	slowest := func(size int) time.Duration { return quiet + time.Duration(size)*perKey }
	s := NewSizer(MinBatch, 30500, MinBatch)
	var sizes []int
	for range 200 {
		size := s.Size()
		sizes = append(sizes, size)
		s.Observe(round(quiet, slowest(size)), budget)
	}
	over := 0
	for i, size := range sizes {
		if w := slowest(size); w > budget {
			over++
			if i >= 20 && w > 2*budget {
				t.Fatalf("round %d: %d keys, slowest commit %s, over twice the budget %s (sizes %v)", i, size, w, budget, sizes)
			}
		}
	}
	// Each round over the budget is followed by one well under it, so at
	// most one round in (growth steps to the budget) goes over.
	if over > len(sizes)/5 {
		t.Fatalf("%d of %d rounds over the budget (sizes %v)", over, len(sizes), sizes)
	}
	if last := sizes[len(sizes)-1]; last < 5000 {
		t.Fatalf("settled at %d keys, under the size the budget allows half of (5,000)", last)
	}
}

// Paced decisions: the round's WAL is charged when the first reading
// after it comes, the wait is exact and marked Paced, a pressure comes
// first, and a requested checkpoint halves an auto pacer.
func TestDecidePaces(t *testing.T) {
	const pos = 1 << 30
	th := New(Limits{PauseMin: 100 * time.Millisecond, PauseMax: time.Second})
	th.Pace(NewWALPacer(1<<20), true)
	th.WatchCheckpoints(7)
	if d := th.Decide(Signals{At: t0, WALPosition: pos, RequestedCheckpoints: 7}); d.Throttled() || d.Checkpoint {
		t.Fatalf("before any round: %+v", d)
	}
	d := th.Decide(Signals{At: t0, WALPosition: pos + 1<<20, RoundWAL: 1 << 20, RequestedCheckpoints: 7})
	// The last round's WAL at the floor (an eighth of the rate) bounds
	// how long the pacer may hold the run before the next.
	if th.allow != 8*time.Second-d.Wait {
		t.Fatalf("allowance %s after a 1 MB round at 1 MB/s", th.allow)
	}
	if !d.Paced || d.Reason != ReasonWALRate || d.Wait != time.Second-pacerDepth {
		t.Fatalf("after a 1 MB round: %+v", d)
	}
	// The same position read again (after a wait cut short) is not
	// charged twice; what the server wrote meanwhile is.
	if d := th.Decide(Signals{At: t0.Add(500 * time.Millisecond), WALPosition: pos + 1<<20, RequestedCheckpoints: 7}); !near(d.Wait, 400*time.Millisecond) {
		t.Fatalf("halfway: %+v", d)
	}
	if d := th.Decide(Signals{At: t0.Add(500 * time.Millisecond), WALPosition: pos + 1<<20 + 1<<18, RequestedCheckpoints: 7}); !near(d.Wait, 650*time.Millisecond) {
		t.Fatalf("halfway, 256 kB more: %+v", d)
	}
	// A signal error carries no position: nothing is charged.
	if d := th.Decide(Signals{At: t0.Add(time.Second), Err: errTest}); d.Paced || d.Reason != ReasonSignalError {
		t.Fatalf("signal error: %+v", d)
	}
	// A requested checkpoint halves the rate, once per checkpoint.
	d = th.Decide(Signals{At: t0.Add(time.Second), WALPosition: pos + 1<<20 + 1<<18, RequestedCheckpoints: 8})
	if !d.Checkpoint || d.Slowed != 1<<19 || th.Pacer().Rate() != 1<<19 {
		t.Fatalf("checkpoint: %+v, rate %f", d, th.Pacer().Rate())
	}
	if d := th.Decide(Signals{At: t0.Add(time.Second), WALPosition: pos + 1<<20 + 1<<18, RequestedCheckpoints: 8}); d.Checkpoint {
		t.Fatalf("the same checkpoint twice: %+v", d)
	}
	// An explicit rate holds through a checkpoint.
	ex := New(Limits{PauseMin: 1, PauseMax: 1})
	ex.Pace(NewWALPacer(1<<20), false)
	ex.WatchCheckpoints(0)
	if d := ex.Decide(Signals{At: t0, WALPosition: pos, RequestedCheckpoints: 1}); !d.Checkpoint || d.Slowed != 0 || ex.Pacer().Rate() != 1<<20 {
		t.Fatalf("explicit rate, checkpoint: %+v", d)
	}
	// A pressure comes before the pacer, and the WAL is charged anyway.
	pr := New(Limits{MaxLag: time.Second, PauseMin: 100 * time.Millisecond, PauseMax: time.Second})
	pr.Pace(NewWALPacer(1<<20), true)
	pr.Decide(Signals{At: t0, WALPosition: pos})
	if d := pr.Decide(Signals{At: t0, WALPosition: pos + 4<<20, RoundWAL: 4 << 20, Lag: time.Minute}); d.Paced || d.Reason != ReasonReplicaLag {
		t.Fatalf("lag and a round: %+v", d)
	}
	if d := pr.Decide(Signals{At: t0.Add(100 * time.Millisecond), WALPosition: pos + 4<<20}); !d.Paced || !near(d.Wait, 4*time.Second-pacerDepth-100*time.Millisecond) {
		t.Fatalf("after the lag: %+v", d)
	}
}

// An API that alone writes more than the rate does not hold the run for
// good: after each round the pacer holds it at most as long as the round's
// WAL takes at the floor, an eighth of the rate.
func TestDecidePacesAtLeastAtTheFloor(t *testing.T) {
	th := New(Limits{PauseMin: 100 * time.Millisecond, PauseMax: time.Second})
	th.Pace(NewWALPacer(1<<20), false)
	pos, now := int64(1<<30), t0
	th.Decide(Signals{At: now, WALPosition: pos})
	var held time.Duration
	// A round of 128 kB, then the API writes 2 MB/s while the run waits.
	pos += 128 << 10
	d := th.Decide(Signals{At: now, WALPosition: pos, RoundWAL: 128 << 10})
	for d.Throttled() {
		if !d.Paced {
			t.Fatalf("%+v", d)
		}
		held += d.Wait
		now = now.Add(d.Wait)
		pos += int64(2 * float64(1<<20) * d.Wait.Seconds())
		d = th.Decide(Signals{At: now, WALPosition: pos})
	}
	if !near(held, time.Second) {
		t.Fatalf("held %s after a 128 kB round with the API over the rate, want the round at the floor: 1s", held)
	}
}

var errTest = errors.New("connection refused")

// near: equal to a microsecond (the pacer's arithmetic is in float
// seconds).
func near(a, b time.Duration) bool { return (a - b).Abs() <= time.Microsecond }

func TestAutoCommitBudget(t *testing.T) {
	if got := AutoCommitBudget(500 * time.Microsecond); got != autoCommitFloor {
		t.Errorf("quiet 0.5ms: %s, want the floor", got)
	}
	if got := AutoCommitBudget(3 * time.Millisecond); got != 12*time.Millisecond {
		t.Errorf("quiet 3ms: %s, want 12ms", got)
	}
}

// wal_rate=auto's rounds are large only while the bucket holds credit:
// once the run is paced a round is a quarter second of the rate, so its
// WAL reaches the server in small steps, not in rounds of megabytes each
// followed by seconds of nothing. The run's speed is the rate's either way.
func TestPacedRoundsAreSmall(t *testing.T) {
	def := Checkpoints{MaxWALSize: 1 << 30, Timeout: 5 * time.Minute, CompletionTarget: 0.9, SegmentSize: 16 << 20}
	b := def.WALBudget()
	p := NewBudgetPacer(b)
	now := t0
	pos := int64(1 << 30)
	p.Observe(now, pos)
	if got := p.BatchBytes(); got != b.Batch {
		t.Fatalf("a round with the bucket full: %.0f bytes, want the largest, %.0f", got, b.Batch)
	}
	// Spend the bucket: rounds of the largest size, instantly.
	var rounds int
	for p.Wait(now) == 0 {
		pos += int64(p.BatchBytes())
		p.Observe(now, pos)
		rounds++
	}
	if rounds > budgetBatchShare+1 {
		t.Fatalf("%d rounds spent a bucket of %d rounds", rounds, budgetBatchShare)
	}
	quarter := b.Rate * pacerBatch.Seconds()
	var written int64
	for range 40 {
		now = now.Add(p.Wait(now))
		got := p.BatchBytes()
		if got > quarter*1.001 {
			t.Fatalf("a paced round of %.0f bytes, over a quarter second of the rate (%.0f)", got, quarter)
		}
		pos += int64(got)
		written += int64(got)
		p.Observe(now, pos)
	}
	// 40 paced rounds at the rate: about 10 s, the rate's speed.
	if took := now.Sub(t0).Seconds(); float64(written)/took < b.Rate*0.9 {
		t.Errorf("paced rounds wrote %.0f B/s, under the rate %.0f", float64(written)/took, b.Rate)
	}
}
