package lowwater

import "testing"

// The first read and every FullEvery-th after it are full, and a forced
// one; the others start at the mark.
func TestFullReads(t *testing.T) {
	var r Reads
	var full []int
	for i := range 3 * FullEvery {
		if r.Full(false) {
			full = append(full, i)
		}
		if !r.Full(true) {
			t.Fatalf("read %d: a forced read is not full", i)
		}
		r = r.Next()
	}
	if len(full) != 3 || full[0] != 0 || full[1] != FullEvery || full[2] != 2*FullEvery {
		t.Fatalf("full reads at %v, want 0, %d and %d", full, FullEvery, 2*FullEvery)
	}
}
