package riverdb

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/riverqueue/river/rivershared/uniquestates"
	"github.com/riverqueue/river/rivertype"
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
	ReasonInvalidSchedule = "invalid_scheduled_at"
	ReasonInvalidCreated  = "invalid_created_at"
	ReasonInvalidUnique   = "invalid_unique"
	ReasonRejectedByRiver = "rejected_by_river"
)

// DeadLetterReasons lists every reason code above. The metric's series are
// created at 0 from it, so a reason's first dead-lettered row is an increase
// Prometheus can see (a series born at 1 has no increase); a test keeps it
// in step with the constants.
var DeadLetterReasons = []string{
	ReasonUnknownKind, ReasonInvalidKind, ReasonInvalidQueue, ReasonInvalidPrio, ReasonInvalidMaxAtt,
	ReasonArgsTooLarge, ReasonInvalidArgs, ReasonInvalidTags, ReasonInvalidMeta, ReasonInvalidSchedule,
	ReasonInvalidCreated, ReasonInvalidUnique, ReasonRejectedByRiver,
}

// These mirror River's own checks (client.go's queue name regex and
// insert_opts.go's tag regex, and river_job's CHECK constraints) so that a bad
// row is recognised before it can fail River's batch insert for its
// neighbours. Beyond River's own checks, a row must be one River's clients
// can read back: finite times in years 1 to 9999 (pgx cannot scan an
// infinite timestamptz into a time.Time, so one such job stops River's
// scheduler and breaks JobGet and JobList; Go's JSON encoding of a time
// stops at year 9999), a one-dimensional tags array. A row River's table
// refuses for a reason not mirrored here is dead-lettered on the Go path's
// row-by-row retry (insertRows); the move's statement checks none of it
// against River at run time, so TestMoveAcceptsWhatRiverAccepts compares
// both with River's own InsertManyTx on generated rows.
var (
	queueNameRE = regexp.MustCompile(`^(?:[a-z0-9])+(?:[_|\-]?[a-z0-9]+)*$`)
	tagRE       = regexp.MustCompile(`\A[\w][\w\-]+[\w]\z`)
)

// TimeMin and TimeMax bound the times a staged row may carry: River's
// clients read them back (the lower bound is River's "not set", the upper
// the last instant Go's JSON encoding of a time can write).
var (
	TimeMin = time.Date(1, 1, 1, 0, 0, 0, 0, time.UTC)
	TimeMax = time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC)
)

// UniqueRequired are the job states River requires in a unique job's
// states (UniqueOpts.ByState must contain them), as River's bitmask.
var UniqueRequired = uniquestates.UniqueStatesToBitmask([]rivertype.JobState{
	rivertype.JobStateAvailable, rivertype.JobStatePending, rivertype.JobStateRunning, rivertype.JobStateScheduled,
})

// UniqueKeyLen is the length of River's unique key, a SHA-256.
const UniqueKeyLen = 32

// StagedRow is one row taken from staged_jobs. Every column is scanned
// into a type that holds whatever the column can: a row the enqueuer
// cannot move is dead-lettered, never a scan error that fails every batch
// it is in (an infinite time, a NULL tag, a tags array of two dimensions).
type StagedRow struct {
	ID          int64
	CreatedAt   pgtype.Timestamptz
	Kind        string
	Args        []byte
	Queue       *string
	Priority    *int32
	MaxAttempts *int32
	ScheduledAt pgtype.Timestamptz
	Tags        pgtype.Array[*string]
	Metadata    []byte
	// UniqueKey and UniqueStates are River's (migration 00021), written
	// by idem.StageInsertTx from River's UniqueOpts or by an API's own
	// River client code.
	UniqueKey    []byte
	UniqueStates pgtype.Bits
}

// finiteTime reports whether t is a time River's clients read back.
func finiteTime(t pgtype.Timestamptz) bool {
	return t.InfinityModifier == pgtype.Finite && !t.Time.Before(TimeMin) && t.Time.Before(TimeMax)
}

// ScheduledAtOrZero is the row's scheduled_at as River's insert takes it: the
// zero time (year 1's first instant, River's "not set") when NULL.
func (r *StagedRow) ScheduledAtOrZero() time.Time {
	if !r.ScheduledAt.Valid {
		return time.Time{}
	}
	return r.ScheduledAt.Time
}

// Invalid is why a row cannot become a River job.
type Invalid struct {
	Code   string // one of DeadLetterReasons
	Detail string
}

func (v *Invalid) Error() string { return v.Code + ": " + v.Detail }

// Validator checks staged rows in Go (Check); ValidSQL checks them in
// SQL with ValidArgs.
type Validator struct {
	allowed      map[string]bool // nil: any kind
	kinds        []string        // allowed as a list; nil: any kind
	maxArgsBytes int
}

// NewValidator accepts the kinds allowed (empty: any) and job_args up to
// maxArgsBytes.
func NewValidator(allowed []string, maxArgsBytes int) Validator {
	v := Validator{maxArgsBytes: maxArgsBytes}
	if len(allowed) > 0 {
		v.allowed = make(map[string]bool, len(allowed))
		v.kinds = slices.Clone(allowed)
		for _, k := range allowed {
			v.allowed[k] = true
		}
	}
	return v
}

// ValidArgs are ValidSQL's parameters for the rules v checks:
// @kinds, @max_args_bytes, @time_min, @time_max, @unique_key_len and
// @unique_required.
func (v *Validator) ValidArgs() pgx.NamedArgs {
	return pgx.NamedArgs{
		"kinds": v.kinds, "max_args_bytes": v.maxArgsBytes,
		"time_min": TimeMin, "time_max": TimeMax,
		"unique_key_len": UniqueKeyLen, "unique_required": int32(UniqueRequired),
	}
}

// Check returns why r cannot become a River job, or nil. ValidSQL is the
// same rules in SQL (TestServerMoveValidatesAsGoDoes, in the enqueuer,
// holds the two together on rows at each rule's edges).
func (v *Validator) Check(r *StagedRow) *Invalid {
	switch {
	case r.Kind == "" || len(r.Kind) >= 128 || !utf8.ValidString(r.Kind):
		return &Invalid{ReasonInvalidKind, fmt.Sprintf("kind must be 1 to 127 bytes of UTF-8, got %d bytes", len(r.Kind))}
	case v.allowed != nil && !v.allowed[r.Kind]:
		return &Invalid{ReasonUnknownKind, fmt.Sprintf("kind %q is not in the enqueuer's allow-list", r.Kind)}
	}
	if len(r.Args) > v.maxArgsBytes {
		return &Invalid{ReasonArgsTooLarge, fmt.Sprintf("job_args is %d bytes, limit %d", len(r.Args), v.maxArgsBytes)}
	}
	// River workers unmarshal args into a struct: anything but an object
	// would fail every attempt of the job.
	if a := bytes.TrimSpace(r.Args); len(a) == 0 || a[0] != '{' {
		return &Invalid{ReasonInvalidArgs, "job_args must be a JSON object"}
	}
	if r.Queue != nil {
		q := *r.Queue
		if q == "" || len(q) > 64 || !queueNameRE.MatchString(q) {
			return &Invalid{ReasonInvalidQueue, fmt.Sprintf("queue %q must be 1 to 64 lower-case letters and digits separated by '_' or '-'", q)}
		}
	}
	if r.Priority != nil && (*r.Priority < 1 || *r.Priority > 4) {
		return &Invalid{ReasonInvalidPrio, "priority must be between 1 and 4, got " + strconv.Itoa(int(*r.Priority))}
	}
	if r.MaxAttempts != nil && (*r.MaxAttempts < 1 || *r.MaxAttempts > 32767) {
		return &Invalid{ReasonInvalidMaxAtt, "max_attempts must be between 1 and 32767, got " + strconv.Itoa(int(*r.MaxAttempts))}
	}
	if len(r.Tags.Dims) > 1 {
		return &Invalid{ReasonInvalidTags, fmt.Sprintf("tags must be a one-dimensional array, got %d dimensions", len(r.Tags.Dims))}
	}
	for _, t := range r.Tags.Elements {
		if t == nil {
			return &Invalid{ReasonInvalidTags, "tags must not contain NULL"}
		}
		if len(*t) > 255 || !tagRE.MatchString(*t) {
			return &Invalid{ReasonInvalidTags, fmt.Sprintf("tag %q must match %s and be at most 255 bytes", *t, tagRE)}
		}
	}
	if len(r.Metadata) > 0 {
		var m map[string]json.RawMessage
		if err := json.Unmarshal(r.Metadata, &m); err != nil || m == nil {
			return &Invalid{ReasonInvalidMeta, "metadata must be a JSON object"}
		}
	}
	if r.ScheduledAt.Valid && !finiteTime(r.ScheduledAt) {
		return &Invalid{ReasonInvalidSchedule, "scheduled_at must be a finite time in the years 1 to 9999, got " + TimeString(r.ScheduledAt)}
	}
	if !finiteTime(r.CreatedAt) {
		return &Invalid{ReasonInvalidCreated, "created_at must be a finite time in the years 1 to 9999, got " + TimeString(r.CreatedAt)}
	}
	switch {
	case (r.UniqueKey == nil) != !r.UniqueStates.Valid:
		return &Invalid{ReasonInvalidUnique, "unique_key and unique_states must be set together or both NULL"}
	case r.UniqueKey != nil && len(r.UniqueKey) != UniqueKeyLen:
		return &Invalid{ReasonInvalidUnique, fmt.Sprintf("unique_key must be River's %d-byte SHA-256, got %d bytes", UniqueKeyLen, len(r.UniqueKey))}
	case r.UniqueStates.Valid && (r.UniqueStates.Len != 8 || len(r.UniqueStates.Bytes) != 1 || r.UniqueStates.Bytes[0]&UniqueRequired != UniqueRequired):
		return &Invalid{ReasonInvalidUnique, "unique_states must hold River's required states available, pending, running and scheduled"}
	}
	return nil
}

// TimeString shows a time a row carried, infinite ones included.
func TimeString(t pgtype.Timestamptz) string {
	switch t.InfinityModifier {
	case pgtype.Infinity:
		return "infinity"
	case pgtype.NegativeInfinity:
		return "-infinity"
	}
	return t.Time.UTC().Format(time.RFC3339Nano)
}

// The metadata keys idemd adds to every River job it writes: the staged
// row's id and created_at. They let anyone trace a job back to its staged
// row (idemctl dead show, idemctl keys, tests' exactly-once checks).
const (
	MetadataStagedID = "idemd_staged_id"
	MetadataStagedAt = "idemd_staged_at"
)

// MetadataFor returns the River job metadata: the staged row's own metadata
// plus MetadataStagedID and MetadataStagedAt. The staged values are merged
// as raw JSON, never decoded: a number stays the digits it was staged with
// (through float64, integers above 2^53 were rounded). MoveSQL builds the
// same object in SQL (TestServerMoveInsertsWhatRiverInserts).
func MetadataFor(r *StagedRow) ([]byte, error) {
	if len(r.Metadata) == 0 {
		b := make([]byte, 0, 80)
		b = append(b, `{"`+MetadataStagedID+`":`...)
		b = strconv.AppendInt(b, r.ID, 10)
		b = append(b, `,"`+MetadataStagedAt+`":"`...)
		b = r.CreatedAt.Time.UTC().AppendFormat(b, time.RFC3339Nano)
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
	m[MetadataStagedID] = strconv.AppendInt(nil, r.ID, 10)
	m[MetadataStagedAt] = strconv.AppendQuote(nil, r.CreatedAt.Time.UTC().Format(time.RFC3339Nano))
	return json.Marshal(m)
}
