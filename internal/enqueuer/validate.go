package enqueuer

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"time"
	"unicode/utf8"
)

// Reason codes for dead-lettered rows. They label a metric, so the set is
// small and fixed; the dead-letter row carries the full human message.
const (
	ReasonUnknownKind     = "unknown_kind"
	ReasonInvalidKind     = "invalid_kind"
	ReasonInvalidQueue    = "invalid_queue"
	ReasonInvalidPrio     = "invalid_priority"
	ReasonInvalidMaxAtt   = "invalid_max_attempts"
	ReasonArgsTooLarge    = "args_too_large"
	ReasonInvalidArgs     = "invalid_args"
	ReasonInvalidTags     = "invalid_tags"
	ReasonInvalidMeta     = "invalid_metadata"
	ReasonRejectedByRiver = "rejected_by_river"
)

// DeadLetterReasons lists every reason code above. The metric's series are
// created at 0 from it, so a reason's first dead-lettered row is an increase
// Prometheus can see (a series born at 1 has no increase); a test keeps it
// in step with the constants.
var DeadLetterReasons = []string{
	ReasonUnknownKind, ReasonInvalidKind, ReasonInvalidQueue, ReasonInvalidPrio, ReasonInvalidMaxAtt,
	ReasonArgsTooLarge, ReasonInvalidArgs, ReasonInvalidTags, ReasonInvalidMeta, ReasonRejectedByRiver,
}

// These mirror River's own checks (client.go's queue name regex and
// insert_opts.go's tag regex, and river_job's CHECK constraints) so that a bad
// row is recognised before it can fail River's batch insert for its
// neighbours. A rule River adds later that is not mirrored here is still
// caught: the batch falls back to row-by-row inserts (see insertRows).
var (
	queueNameRE = regexp.MustCompile(`^(?:[a-z0-9])+(?:[_|\-]?[a-z0-9]+)*$`)
	tagRE       = regexp.MustCompile(`\A[\w][\w\-]+[\w]\z`)
)

// stagedRow is one row taken from staged_jobs.
type stagedRow struct {
	ID          int64
	CreatedAt   time.Time
	Kind        string
	Args        []byte
	Queue       *string
	Priority    *int32
	MaxAttempts *int32
	ScheduledAt *time.Time
	// Tags' elements may be NULL (a text[] can hold NULL): such a row is
	// dead-lettered, not a scan error that fails every batch it is in.
	Tags     []*string
	Metadata []byte
}

// invalid is why a row cannot become a River job.
type invalid struct {
	code   string
	detail string
}

func (v *invalid) Error() string { return v.code + ": " + v.detail }

type validator struct {
	allowed      map[string]bool // nil: any kind
	maxArgsBytes int
}

// newValidator accepts the kinds allowed (empty: any) and job_args up to
// maxArgsBytes.
func newValidator(allowed []string, maxArgsBytes int) validator {
	v := validator{maxArgsBytes: maxArgsBytes}
	if len(allowed) > 0 {
		v.allowed = make(map[string]bool, len(allowed))
		for _, k := range allowed {
			v.allowed[k] = true
		}
	}
	return v
}

func (v *validator) check(r *stagedRow) *invalid {
	switch {
	case r.Kind == "" || len(r.Kind) >= 128 || !utf8.ValidString(r.Kind):
		return &invalid{ReasonInvalidKind, fmt.Sprintf("kind must be 1 to 127 bytes of UTF-8, got %d bytes", len(r.Kind))}
	case v.allowed != nil && !v.allowed[r.Kind]:
		return &invalid{ReasonUnknownKind, fmt.Sprintf("kind %q is not in the enqueuer's allow-list", r.Kind)}
	}
	if len(r.Args) > v.maxArgsBytes {
		return &invalid{ReasonArgsTooLarge, fmt.Sprintf("job_args is %d bytes, limit %d", len(r.Args), v.maxArgsBytes)}
	}
	// River workers unmarshal args into a struct: anything but an object
	// would fail every attempt of the job.
	if a := bytes.TrimSpace(r.Args); len(a) == 0 || a[0] != '{' {
		return &invalid{ReasonInvalidArgs, "job_args must be a JSON object"}
	}
	if r.Queue != nil {
		q := *r.Queue
		if q == "" || len(q) > 64 || !queueNameRE.MatchString(q) {
			return &invalid{ReasonInvalidQueue, fmt.Sprintf("queue %q must be 1 to 64 lower-case letters and digits separated by '_' or '-'", q)}
		}
	}
	if r.Priority != nil && (*r.Priority < 1 || *r.Priority > 4) {
		return &invalid{ReasonInvalidPrio, "priority must be between 1 and 4, got " + strconv.Itoa(int(*r.Priority))}
	}
	if r.MaxAttempts != nil && (*r.MaxAttempts < 1 || *r.MaxAttempts > 32767) {
		return &invalid{ReasonInvalidMaxAtt, "max_attempts must be between 1 and 32767, got " + strconv.Itoa(int(*r.MaxAttempts))}
	}
	for _, t := range r.Tags {
		if t == nil {
			return &invalid{ReasonInvalidTags, "tags must not contain NULL"}
		}
		if len(*t) > 255 || !tagRE.MatchString(*t) {
			return &invalid{ReasonInvalidTags, fmt.Sprintf("tag %q must match %s and be at most 255 bytes", *t, tagRE)}
		}
	}
	if len(r.Metadata) > 0 {
		var m map[string]json.RawMessage
		if err := json.Unmarshal(r.Metadata, &m); err != nil || m == nil {
			return &invalid{ReasonInvalidMeta, "metadata must be a JSON object"}
		}
	}
	return nil
}

// metadataFor returns the River job metadata: the staged row's own metadata
// plus idemd_staged_id and idemd_staged_at, which let anyone trace a job back
// to the staged row (and let tests check exactly-once with SQL). The staged
// values are merged as raw JSON, never decoded: a number stays the digits
// it was staged with (through float64, integers above 2^53 were rounded).
func metadataFor(r *stagedRow) ([]byte, error) {
	if len(r.Metadata) == 0 {
		b := make([]byte, 0, 80)
		b = append(b, `{"idemd_staged_id":`...)
		b = strconv.AppendInt(b, r.ID, 10)
		b = append(b, `,"idemd_staged_at":"`...)
		b = r.CreatedAt.UTC().AppendFormat(b, time.RFC3339Nano)
		b = append(b, `"}`...)
		return b, nil
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(r.Metadata, &m); err != nil {
		return nil, fmt.Errorf("metadata: %w", err)
	}
	if m == nil {
		return nil, errors.New("metadata: not a JSON object")
	}
	m["idemd_staged_id"] = strconv.AppendInt(nil, r.ID, 10)
	m["idemd_staged_at"] = strconv.AppendQuote(nil, r.CreatedAt.UTC().Format(time.RFC3339Nano))
	return json.Marshal(m)
}
