package overlap

import (
	"testing"
	"time"
)

var t0 = time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)

func at(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }

func span(process string, from, to int) Span {
	return Span{Process: process, Start: at(from), End: at(to), Txs: 1}
}

func TestFind(t *testing.T) {
	for _, c := range []struct {
		name  string
		spans []Span
		want  int
	}{
		{"one after another", []Span{span("prev", 0, 10), span("cur", 11, 20), span("prev", 21, 30)}, 0},
		{"touching", []Span{span("prev", 0, 10), span("cur", 10, 20)}, 0},
		{"overlapping", []Span{span("prev", 0, 10), span("cur", 9, 20)}, 1},
		{"the later listed first", []Span{span("cur", 9, 20), span("prev", 0, 10)}, 1},
		{"one process with itself", []Span{span("prev", 0, 10), span("prev", 5, 20)}, 0},
		// A long run of one process spans short transactions of another
		// that do not overlap each other: each is a pair, however many
		// spans started in between.
		{"a long span over several short ones", []Span{
			span("prev", 0, 100), span("cur", 10, 20), span("other", 25, 26), span("cur", 30, 40), span("cur", 150, 160),
		}, 3},
		{"same start", []Span{span("prev", 5, 10), span("cur", 5, 6)}, 1},
		{"nothing", nil, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			got := Find(c.spans)
			if len(got) != c.want {
				t.Fatalf("Find found %d overlaps, want %d: %v", len(got), c.want, got)
			}
			for _, p := range got {
				if p.A.Process == p.B.Process {
					t.Errorf("paired one process's spans: %v", p)
				}
			}
		})
	}
}

// Two runs whose transactions alternate never have two transactions at
// once, yet the runs overlap: per transaction nothing is found, per run
// the overlap is.
func TestSpansOfRuns(t *testing.T) {
	var ds []Deletion
	for i := range 4 {
		ds = append(ds,
			Deletion{Process: "reaper-prev", Txid: int64(100 + i), XactStart: at(20 * i), At: at(20*i + 5), Rows: 20},
			Deletion{Process: "reaper-cur", Txid: int64(200 + i), XactStart: at(20*i + 10), At: at(20*i + 15), Rows: 20},
		)
	}
	// A transaction that deleted twice is one span.
	ds = append(ds, Deletion{Process: "reaper-prev", Txid: 103, XactStart: at(60), At: at(68), Rows: 1})

	perTx := Spans(ds, nil)
	if len(perTx) != 8 {
		t.Fatalf("%d spans per transaction, want 8: %v", len(perTx), perTx)
	}
	for _, s := range perTx {
		if s.Process == "reaper-prev" && s.Start.Equal(at(60)) && (!s.End.Equal(at(68)) || s.Rows != 21) {
			t.Errorf("transaction 103's span is %v, want to 68 ms with 21 rows", s)
		}
	}
	if p := Find(perTx); len(p) != 0 {
		t.Errorf("alternating transactions overlap: %v", p)
	}

	perRun := Spans(ds, func(string) bool { return true })
	if len(perRun) != 2 {
		t.Fatalf("%d spans per run, want 2: %v", len(perRun), perRun)
	}
	for _, s := range perRun {
		if s.Process == "reaper-prev" && (s.Txs != 4 || s.Rows != 81 || !s.Start.Equal(at(0)) || !s.End.Equal(at(68))) {
			t.Errorf("reaper-prev's run is %v, want 4 transactions, 81 rows, [0, 68] ms", s)
		}
	}
	if p := Find(perRun); len(p) != 1 {
		t.Errorf("interleaved runs: %d overlaps, want 1: %v", len(p), p)
	}
}
