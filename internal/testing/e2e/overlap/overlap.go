// Package overlap finds the moments two processes did exclusive work at
// the same time, from a log of what each did and when. The end-to-end
// suite uses it to check that reaper runs never delete keys at once,
// whatever release each reaper runs: the log comes from a trigger on
// idempotency_keys, not from the reapers.
package overlap

import (
	"cmp"
	"fmt"
	"slices"
	"time"
)

// Deletion is one committed DELETE statement, as the trigger recorded it.
type Deletion struct {
	Process   string    // the session's application_name: which process deleted
	Txid      int64     // the deleting transaction
	XactStart time.Time // the transaction's start (now() in the trigger)
	At        time.Time // clock_timestamp() once the statement had deleted
	Rows      int64     // rows the statement deleted
}

// Span is a time a process was deleting: from the start of a transaction
// to its last deletion, or, for a process that does one run, from its
// first transaction's start to its last deletion.
type Span struct {
	Process    string
	Start, End time.Time
	Txs        int   // transactions in the span
	Rows       int64 // rows they deleted
}

func (s Span) String() string {
	return fmt.Sprintf("%s [%s, %s] (%d transactions, %d rows)", s.Process,
		s.Start.Format("15:04:05.000000"), s.End.Format("15:04:05.000000"), s.Txs, s.Rows)
}

// Spans turns deletions into spans: one per transaction, except for the
// processes oneRun names, whose deletions all belong to a single run and
// make one span. A transaction's span starts at the transaction's start,
// which is before any of its deletions took a row lock, so it covers the
// whole time the transaction could hold deleted rows apart from its commit.
func Spans(ds []Deletion, oneRun func(process string) bool) []Span {
	type key struct {
		process string
		txid    int64 // 0 for a one-run process: all its deletions
	}
	type acc struct {
		span Span
		txs  map[int64]bool
	}
	byKey := map[key]*acc{}
	var order []key
	for _, d := range ds {
		k := key{d.Process, d.Txid}
		if oneRun != nil && oneRun(d.Process) {
			k.txid = 0
		}
		a, ok := byKey[k]
		if !ok {
			a = &acc{span: Span{Process: d.Process, Start: d.XactStart, End: d.At}, txs: map[int64]bool{}}
			byKey[k] = a
			order = append(order, k)
		}
		if d.XactStart.Before(a.span.Start) {
			a.span.Start = d.XactStart
		}
		if d.At.After(a.span.End) {
			a.span.End = d.At
		}
		a.span.Rows += d.Rows
		a.txs[d.Txid] = true
	}
	out := make([]Span, 0, len(order))
	for _, k := range order {
		a := byKey[k]
		a.span.Txs = len(a.txs)
		out = append(out, a.span)
	}
	return out
}

// Pair is two spans of different processes that share a moment.
type Pair struct{ A, B Span }

func (p Pair) String() string { return fmt.Sprintf("%s overlaps %s", p.A, p.B) }

// Find returns every pair of spans of different processes that overlap:
// each starts before the other ends. Spans that only touch (one ends at
// the instant the other starts) do not overlap. Spans of one process are
// never paired: a process's own transactions are its own affair.
func Find(spans []Span) []Pair {
	sorted := slices.Clone(spans)
	slices.SortFunc(sorted, func(a, b Span) int {
		return cmp.Or(a.Start.Compare(b.Start), a.End.Compare(b.End), cmp.Compare(a.Process, b.Process))
	})
	var pairs []Pair
	var open []Span // spans started so far that may still overlap a later one
	for _, s := range sorted {
		// A span that ended by s's start ends before every later start too.
		open = slices.DeleteFunc(open, func(o Span) bool { return !o.End.After(s.Start) })
		for _, o := range open {
			if o.Process != s.Process && s.Start.Before(o.End) && o.Start.Before(s.End) {
				pairs = append(pairs, Pair{A: o, B: s})
			}
		}
		open = append(open, s)
	}
	return pairs
}
