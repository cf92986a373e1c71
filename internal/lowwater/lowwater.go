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
