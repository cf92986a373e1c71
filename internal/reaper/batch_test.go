package reaper

import (
	"errors"
	"testing"
)

// TestCheckBatch: the rule that decides whether a batch may commit,
// without a database.
func TestCheckBatch(t *testing.T) {
	caps := DefaultSettings()
	caps.MaxDeletes, caps.MaxFlags = 10, 3
	noCaps := DefaultSettings()
	for _, tc := range []struct {
		name string
		s    Settings
		form batchForm
		job  batchJob
		b    batchResult
		want error
	}{
		{"range batch with deletions", noCaps, rangeForm, batchJob{}, batchResult{deleted: 5, more: true}, nil},
		{"range batch empty, keys left", noCaps, rangeForm, batchJob{}, batchResult{more: true}, errRangeEmpty},
		{"range batch empty, nothing left", noCaps, rangeForm, batchJob{}, batchResult{}, nil},
		{"ordered batch empty, keys left", noCaps, orderedForm, batchJob{}, batchResult{more: true}, nil},
		{"locking batch empty, keys left", noCaps, lockingForm, batchJob{}, batchResult{more: true}, nil},
		{"up to --max-deletes", caps, rangeForm, batchJob{deleted: 6}, batchResult{deleted: 4}, nil},
		{"past --max-deletes", caps, rangeForm, batchJob{deleted: 6}, batchResult{deleted: 5}, ErrCapExceeded},
		{"up to --max-flags", caps, rangeForm, batchJob{flagged: 1}, batchResult{deleted: 2, flaggedUnfinished: 1, flaggedGaveUp: 1}, nil},
		{"past --max-flags", caps, orderedForm, batchJob{flagged: 2}, batchResult{deleted: 2, flaggedUnfinished: 1, flaggedGaveUp: 1}, ErrCapExceeded},
		{"no caps", noCaps, lockingForm, batchJob{deleted: 1 << 40, flagged: 1 << 40}, batchResult{deleted: 9, flaggedGaveUp: 9}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := checkBatch(&tc.s, tc.form, tc.job, tc.b)
			if (tc.want == nil) != (err == nil) || (tc.want != nil && !errors.Is(err, tc.want)) {
				t.Fatalf("checkBatch = %v, want %v", err, tc.want)
			}
		})
	}
}

// TestBatchLimit: a batch takes at most one key past --max-deletes, so the
// batch that would cross the cap finds out and rolls back.
func TestBatchLimit(t *testing.T) {
	for _, tc := range []struct {
		maxDeletes, deleted int64
		size, want          int
	}{
		{0, 0, 100, 100},
		{0, 1 << 40, 100, 100},
		{1000, 0, 100, 100},
		{1000, 950, 100, 51},
		{1000, 1000, 100, 1},
		{10, 0, 100, 11},
	} {
		s := &Service{cfg: Config{Settings: DefaultSettings()}}
		s.cfg.MaxDeletes = tc.maxDeletes
		if got := s.batchLimit(tc.size, tc.deleted); got != tc.want {
			t.Errorf("--max-deletes %d, %d deleted, batch size %d: limit %d, want %d", tc.maxDeletes, tc.deleted, tc.size, got, tc.want)
		}
	}
}
