// Package lowwater is what the enqueuer's sweep and the completer's walks
// share about their low-water marks. Each reads a table through its
// primary key, where a snapshot held open (a long report, pg_dump) keeps
// the entries of deleted rows until VACUUM may remove them; a read from
// the start of the index would walk all of them. So each starts at a mark:
// a position below which no row it looks for exists now or can appear
// later. How a service establishes its mark is its own (the enqueuer from
// the id sequence and the transactions holding it, the completer from a
// time bound); both read from the start of the index now and then, to
// find rows that appeared below the mark all the same, which they count
// as gaps.
package lowwater

// BeginSQL begins every transaction that walks a table's primary key from
// a mark (the enqueuer's moves, sweep and backlog gauges on staged_jobs;
// the completer's claims, mark reads and prune on idemd_unfinished_keys).
// While an old snapshot keeps dead rows, the table is a few live rows in a
// long heap and index, and the planner, whose statistics say "a few rows"
// and, for a range from the mark, "the whole table", prefers reading every
// heap page (a sequential or bitmap scan and a sort) to walking the index
// from the mark, which touches only the entries from there on. With those
// two scans switched off it can only walk the index. SET LOCAL ends with
// the transaction: nothing stays on a server connection a pooler hands to
// someone else.
const BeginSQL = `BEGIN; SET LOCAL enable_seqscan = off; SET LOCAL enable_bitmapscan = off`

// FullEvery is how often a mark's read starts from the start of the index:
// the first read and every FullEvery-th after it. A row below the mark is
// found within FullEvery reads.
const FullEvery = 30

// Reads counts a mark's reads.
type Reads struct {
	// Done is the reads so far.
	Done int
}

// Full reports whether the next read starts from the start of the index:
// the first read, every FullEvery-th after it, and a forced one (a
// one-shot pass, which has no earlier read to trust).
func (r Reads) Full(force bool) bool {
	return force || r.Done%FullEvery == 0
}

// Next is r after one more read.
func (r Reads) Next() Reads { return Reads{Done: r.Done + 1} }
