package throttle

import (
	"errors"
	"strings"
	"testing"
	"time"
)

var testLimits = Limits{
	MaxLag:       time.Second,
	MaxLagBytes:  64 << 20,
	MaxLoad:      Load{WALRate: 32 << 20, CommitLatency: 20 * time.Millisecond},
	CriticalLoad: Load{WALRate: 256 << 20, CommitLatency: 200 * time.Millisecond},
	PauseMin:     100 * time.Millisecond,
	PauseMax:     time.Second,
}

// One decision from a fresh throttle, for each signal on each side of its
// limit.
func TestDecide(t *testing.T) {
	for _, tc := range []struct {
		name   string
		s      Signals
		reason Reason
		stop   bool
	}{
		{"nothing", Signals{}, ReasonNone, false},
		{"everything just at its limit", Signals{Lag: time.Second, LagBytes: 64 << 20, WALRate: 32 << 20, HasWALRate: true, CommitLatency: 20 * time.Millisecond}, ReasonNone, false},
		{"operator", Signals{Paused: true}, ReasonOperator, false},
		{"operator before a signal error", Signals{Paused: true, Err: errors.New("x")}, ReasonOperator, false},
		{"signal error", Signals{Err: errors.New("connection refused")}, ReasonSignalError, false},
		{"lag", Signals{Lag: 1001 * time.Millisecond}, ReasonReplicaLag, false},
		{"lag before bytes", Signals{Lag: 2 * time.Second, LagBytes: 1 << 30}, ReasonReplicaLag, false},
		{"bytes", Signals{LagBytes: 64<<20 + 1}, ReasonReplicaBytes, false},
		// --max-load's wal_rate is the pacer's (TestDecidePaces), not a
		// reading of the server's rate.
		{"server wal rate over --max-load's", Signals{WALRate: 33 << 20, HasWALRate: true}, ReasonNone, false},
		{"wal rate unknown on the first reading", Signals{WALRate: 1 << 40}, ReasonNone, false},
		{"commit latency", Signals{CommitLatency: 21 * time.Millisecond}, ReasonCommitLatency, false},
		{"critical commit latency", Signals{CommitLatency: 201 * time.Millisecond}, ReasonCommitLatency, true},
		{"critical wal rate", Signals{WALRate: 257 << 20, HasWALRate: true}, ReasonWALRate, true},
		{"critical before operator", Signals{Paused: true, CommitLatency: time.Second}, ReasonCommitLatency, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := New(testLimits).Decide(tc.s)
			if d.Reason != tc.reason || d.Stop != tc.stop {
				t.Fatalf("Decide(%+v) = %+v, want reason %q stop %v", tc.s, d, tc.reason, tc.stop)
			}
			switch {
			case tc.stop && d.Wait != 0:
				t.Errorf("a stop waits %s", d.Wait)
			case !tc.stop && tc.reason != ReasonNone && d.Wait != testLimits.PauseMin:
				t.Errorf("first throttled wait %s, want --pause-min %s", d.Wait, testLimits.PauseMin)
			case tc.reason == ReasonNone && d.Throttled():
				t.Errorf("unthrottled decision waits %s", d.Wait)
			case tc.reason != ReasonNone && d.Detail == "":
				t.Errorf("no detail for reason %q", d.Reason)
			}
		})
	}
}

// Over a stretch of pressure the wait doubles from --pause-min to
// --pause-max and stays there; once the pressure is gone the next stretch
// starts at the floor again.
func TestDecideAdapts(t *testing.T) {
	th := New(testLimits)
	lagging := Signals{Lag: 5 * time.Second}
	var got []time.Duration
	for range 6 {
		got = append(got, th.Decide(lagging).Wait)
	}
	want := []time.Duration{100 * time.Millisecond, 200 * time.Millisecond, 400 * time.Millisecond, 800 * time.Millisecond, time.Second, time.Second}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("waits %v, want %v", got, want)
		}
	}
	if d := th.Decide(Signals{}); d.Throttled() {
		t.Fatalf("pressure gone: %+v", d)
	}
	if d := th.Decide(Signals{CommitLatency: time.Second / 20}); d.Wait != testLimits.PauseMin || d.Reason != ReasonCommitLatency {
		t.Fatalf("a new stretch: %+v, want --pause-min for commit_latency", d)
	}
	// A stop ends a stretch too.
	th.Decide(lagging)
	if d := th.Decide(Signals{CommitLatency: time.Second}); !d.Stop {
		t.Fatalf("critical: %+v", d)
	}
	if d := th.Decide(lagging); d.Wait != testLimits.PauseMin {
		t.Fatalf("after a stop: %+v, want --pause-min", d)
	}
}

// Zero limits are no limits.
func TestDecideNoLimits(t *testing.T) {
	th := New(Limits{PauseMin: time.Millisecond, PauseMax: time.Millisecond})
	s := Signals{Replicas: 3, Lag: time.Hour, LagBytes: 1 << 40, WALRate: 1 << 40, HasWALRate: true, CommitLatency: time.Hour}
	if d := th.Decide(s); d.Throttled() || d.Stop {
		t.Fatalf("no limits: %+v", d)
	}
}

func TestParseLoad(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want Load
		err  string
	}{
		{"", Load{}, ""},
		{" ", Load{}, ""},
		{"wal_rate=64MB", Load{WALRate: 64 << 20}, ""},
		{"wal_rate=512kB,commit_latency=20ms", Load{WALRate: 512 << 10, CommitLatency: 20 * time.Millisecond}, ""},
		{"commit_latency = 1s , wal_rate = 1048576", Load{WALRate: 1 << 20, CommitLatency: time.Second}, ""},
		{"wal_rate=1.5GB", Load{WALRate: 1.5 * (1 << 30)}, ""},
		{"wal_rate", Load{}, "want name=value"},
		{"wal_rate=", Load{}, "want name=value"},
		{"wal_rate=-1MB", Load{}, "not a positive size"},
		{"wal_rate=fast", Load{}, "not a positive size"},
		{"commit_latency=0s", Load{}, "must be positive"},
		{"commit_latency=20", Load{}, "commit_latency"},
		{"threads_running=30", Load{}, "unknown load signal"},
		{"wal_rate=1MB,wal_rate=2MB", Load{}, "given twice"},
		{"wal_rate=auto,commit_latency=auto", Load{WALRateAuto: true, CommitLatencyAuto: true}, ""},
		{"commit_latency=auto", Load{CommitLatencyAuto: true}, ""},
		{"wal_rate=Auto", Load{}, "not a positive size"},
	} {
		got, err := ParseLoad(tc.in)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("ParseLoad(%q) = %+v, %v; want an error containing %q", tc.in, got, err, tc.err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("ParseLoad(%q) = %+v, %v; want %+v", tc.in, got, err, tc.want)
		}
		// What String renders, ParseLoad reads back.
		if back, err := ParseLoad(got.String()); err != nil || back != got {
			t.Errorf("ParseLoad(%q.String() = %q) = %+v, %v", tc.in, got.String(), back, err)
		}
	}
}

func TestLimitsCheck(t *testing.T) {
	if p := testLimits.Check(); len(p) != 0 {
		t.Fatalf("valid limits: %v", p)
	}
	bad := Limits{
		MaxLag: -1, MaxLagBytes: -1, PauseMin: 0, PauseMax: -1,
		MaxLoad:      Load{WALRate: 10, CommitLatency: time.Second},
		CriticalLoad: Load{WALRate: 10, CommitLatency: time.Millisecond},
	}
	p := strings.Join(bad.Check(), "\n")
	for _, want := range []string{"--max-lag must", "--max-lag-bytes", "--pause-min", "--pause-max", "wal_rate must be above", "commit_latency must be above"} {
		if !strings.Contains(p, want) {
			t.Errorf("problems %q lack %q", p, want)
		}
	}
	auto := Limits{PauseMin: 1, PauseMax: 1, MaxLoad: Load{WALRateAuto: true, CommitLatencyAuto: true}}
	if p := auto.Check(); len(p) != 0 {
		t.Errorf("auto --max-load: %v", p)
	}
	auto.CriticalLoad = Load{CommitLatencyAuto: true}
	if p := strings.Join(auto.Check(), "\n"); !strings.Contains(p, "not auto") {
		t.Errorf("auto --critical-load: problems %q", p)
	}
}

// The wait after a round that slowed the API's commits past the limit
// doubles from --pause-min to --pause-max round after round, halves after
// each round that did not (to nothing below --pause-min), and never holds
// the next reading of the same gap.
func TestDecideAfterRound(t *testing.T) {
	th := New(testLimits)
	hurt := Signals{RoundCommitLatency: 30 * time.Millisecond}
	fine := Signals{RoundCommitLatency: 5 * time.Millisecond}
	var got []time.Duration
	for _, s := range []Signals{hurt, {}, hurt, {}, hurt, hurt, hurt, hurt, fine, fine, fine, fine, fine} {
		d := th.Decide(s)
		if d.Throttled() && (!d.AfterRound || d.Reason != ReasonCommitLatency) {
			t.Fatalf("Decide(%+v) = %+v", s, d)
		}
		got = append(got, d.Wait)
	}
	ms := time.Millisecond
	want := []time.Duration{100 * ms, 0, 200 * ms, 0, 400 * ms, 800 * ms, time.Second, time.Second, 0, 0, 0, 0, 0}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("waits %v, want %v", got, want)
		}
	}
	// Halved from 1s by the clean rounds: 500ms, 250ms, 125ms, then below
	// --pause-min and gone, so a hurting round starts again at the floor.
	if d := th.Decide(hurt); d.Wait != testLimits.PauseMin {
		t.Fatalf("after clean rounds: %+v, want --pause-min", d)
	}
	// Another limit comes first, as a stretch of its own.
	if d := th.Decide(Signals{Lag: time.Minute, RoundCommitLatency: time.Second / 2}); d.Reason != ReasonReplicaLag || d.AfterRound {
		t.Fatalf("lag and a slow round: %+v", d)
	}
	// Without a commit_latency limit a round's probes are ignored.
	if d := New(Limits{PauseMin: ms, PauseMax: ms}).Decide(hurt); d.Throttled() {
		t.Fatalf("no limit: %+v", d)
	}
}
