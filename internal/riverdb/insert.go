package riverdb

import "github.com/riverqueue/river"

// InsertParams is a valid staged row (Validator.Check) as River's client
// inserts it on a Driver: the row's args unchanged, its options, River's
// defaults for what it leaves NULL, its metadata with MetadataStagedID and
// MetadataStagedAt, and its unique key and states as it was staged.
func InsertParams(r *StagedRow) (river.InsertManyParams, error) {
	md, err := MetadataFor(r)
	if err != nil {
		return river.InsertManyParams{}, err
	}
	var tags []string // nil when the row has none: River's default, {}
	for _, t := range r.Tags.Elements {
		tags = append(tags, *t) // never nil: validated
	}
	opts := &river.InsertOpts{Metadata: md, Tags: tags}
	if r.Queue != nil {
		opts.Queue = *r.Queue
	}
	if r.Priority != nil {
		opts.Priority = int(*r.Priority)
	}
	if r.MaxAttempts != nil {
		opts.MaxAttempts = int(*r.MaxAttempts)
	}
	opts.ScheduledAt = r.ScheduledAtOrZero()
	a := StagedArgs{KindName: r.Kind, Args: r.Args}
	if r.UniqueKey != nil {
		a.UniqueKey, a.UniqueStates = r.UniqueKey, r.UniqueStates.Bytes[0] // validated: one byte
	}
	return river.InsertManyParams{Args: a, InsertOpts: opts}, nil
}
