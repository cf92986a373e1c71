package operator

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemd/idemd/internal/review"
	"github.com/idemd/idemd/internal/riverdb"
)

// KeyRef names one key: by id, or by user and idempotency key.
type KeyRef struct {
	ID     int64
	UserID int64
	Key    string
}

// Check reports a ref that names no key or two ways at once.
func (r KeyRef) Check() []string {
	switch {
	case r.ID != 0 && (r.UserID != 0 || r.Key != ""):
		return []string{"give either --id or --user-id with --key, not both"}
	case r.ID < 0:
		return []string{"--id must be positive"}
	case r.ID > 0:
		return nil
	case r.UserID == 0 && r.Key == "":
		return []string{"name a key: --id, or --user-id with --key"}
	case r.Key == "":
		return []string{"--key is required with --user-id"}
	case r.UserID == 0:
		return []string{"--user-id is required with --key"}
	}
	return nil
}

func (r KeyRef) String() string {
	if r.ID > 0 {
		return fmt.Sprintf("key %d", r.ID)
	}
	return fmt.Sprintf("key %q of user %d", r.Key, r.UserID)
}

// Key is one idempotency_keys row as an operator reads it.
type Key struct {
	ID                     int64           `json:"id"`
	CreatedAt              time.Time       `json:"created_at"`
	UserID                 int64           `json:"user_id"`
	IdempotencyKey         string          `json:"idempotency_key"`
	RecoveryPoint          string          `json:"recovery_point"`
	RequestMethod          string          `json:"request_method"`
	RequestPath            string          `json:"request_path"`
	RequestParams          json.RawMessage `json:"request_params"`
	RequestFingerprint     *string         `json:"request_fingerprint"`
	UpstreamIdempotencyKey *string         `json:"upstream_idempotency_key"`
	LastRunAt              time.Time       `json:"last_run_at"`
	LockedAt               *time.Time      `json:"locked_at"`
	ResponseCode           *int32          `json:"response_code"`
	ResponseBody           *string         `json:"response_body"`
	CompleterAttempts      int32           `json:"completer_attempts"`
	CompleterNextAttemptAt *time.Time      `json:"completer_next_attempt_at"`
	CompleterLeasedUntil   *time.Time      `json:"completer_leased_until"`
	CompleterLastError     *string         `json:"completer_last_error"`
	CompleterGaveUpAt      *time.Time      `json:"completer_gave_up_at"`
}

// Key states, as KeyState names them.
const (
	StateGone          = "gone"         // no row: reaped (its reviews keep a snapshot) or never existed
	StateFinished      = "finished"     // the API finished it; nothing left to do
	StateGaveUp        = "gave_up"      // the completer gave up; a review is open or was resolved
	StateReplaying     = "replaying"    // a completer replica holds its lease right now
	StateBackingOff    = "backing_off"  // failed attempts; the next one is scheduled
	StateUnfinished    = "unfinished"   // the completer will take it when it is due
	StatePastHorizon   = "past_horizon" // unfinished but older than --give-up-after: the completer gives up at its next claim
	horizonExplanation = "older than the completer's --give-up-after (%s): at its next claim the completer gives up on it without a request (the payment provider may have forgotten its key)"
)

// KeyState is the one word that says where a key stands for the completer,
// decided from the row and the database clock (now).
func KeyState(k *Key, now time.Time, giveUpAfter time.Duration) string {
	switch {
	case k == nil:
		return StateGone
	case k.RecoveryPoint == "finished":
		return StateFinished
	case k.CompleterGaveUpAt != nil:
		return StateGaveUp
	case k.CompleterLeasedUntil != nil && k.CompleterLeasedUntil.After(now):
		return StateReplaying
	case giveUpAfter > 0 && !k.CreatedAt.Add(giveUpAfter).After(now):
		return StatePastHorizon
	case k.CompleterNextAttemptAt != nil && k.CompleterNextAttemptAt.After(now):
		return StateBackingOff
	default:
		return StateUnfinished
	}
}

// Review is one idempotency_key_reviews row, as `idemctl review list`
// prints it (internal/ctl's Review is this type) and the console shows it.
type Review struct {
	ID             int64           `json:"id"`
	KeyID          int64           `json:"key_id"`
	UserID         int64           `json:"user_id"`
	IdempotencyKey string          `json:"idempotency_key"`
	Reason         string          `json:"reason"`
	Detail         *string         `json:"detail"`
	RecoveryPoint  *string         `json:"recovery_point"`
	FlaggedBy      string          `json:"flagged_by"`
	FlaggedAt      time.Time       `json:"flagged_at"`
	AgeSeconds     float64         `json:"age_seconds"`
	ResolvedAt     *time.Time      `json:"resolved_at"`
	ResolvedBy     *string         `json:"resolved_by"`
	ResolutionNote *string         `json:"resolution_note"`
	Snapshot       json.RawMessage `json:"snapshot"`
}

// Open reports whether the review is unresolved.
func (r Review) Open() bool { return r.ResolvedAt == nil }

// JobRef is a staged, dead-lettered or River job found for a key.
type JobRef struct {
	ID        int64      `json:"id"`
	Kind      string     `json:"kind"`
	State     string     `json:"state"` // staged, dead, or River's state
	Queue     *string    `json:"queue,omitempty"`
	Attempt   *int32     `json:"attempt,omitempty"`
	CreatedAt time.Time  `json:"created_at"`
	DoneAt    *time.Time `json:"finalized_at,omitempty"`
	StagedID  *int64     `json:"staged_id,omitempty"` // a River job's idemd_staged_id
	Reason    *string    `json:"reason,omitempty"`    // a dead letter's reason
}

// KeyJobs are the jobs staged for a key. Nothing in the schema links a
// staged job to the key whose phase staged it: staged_jobs has no key
// column and idem.StageJob records none. A job is found here only when the
// API staged it with metadata {"idemd_key_id": <key id>}
// (idem.StageOptions.Metadata); the enqueuer copies staged metadata onto
// the River job, adding idemd_staged_id.
type KeyJobs struct {
	LinkKey string   `json:"link_metadata_key"`
	Note    string   `json:"note"`
	Staged  []JobRef `json:"staged"`
	Dead    []JobRef `json:"dead"`
	River   []JobRef `json:"river"`
}

// JobLinkKey is the metadata key that links a staged job to its key.
const JobLinkKey = "idemd_key_id"

const jobsNote = "staged jobs are linked to a key only when the API stages them with metadata {\"" + JobLinkKey +
	"\": <key id>}: staged_jobs has no key column and idem.StageJob records none"

// KeyReport is everything `idemctl keys show` and the console's key page
// show about one key.
type KeyReport struct {
	At                time.Time `json:"at"` // the database clock the ages are measured on
	Ref               string    `json:"ref"`
	KeyID             int64     `json:"key_id"` // 0 when neither the key nor a review names an id
	Key               *Key      `json:"key"`    // nil when the row is gone
	State             string    `json:"state"`
	GiveUpAfter       string    `json:"give_up_after"`
	PastGiveUpHorizon bool      `json:"past_give_up_horizon"`
	// Tracked: the key has a row in idemd_unfinished_keys, where the
	// completer looks for candidates.
	Tracked bool     `json:"tracked"`
	Reviews []Review `json:"reviews"`
	Actions []Action `json:"actions"`
	Jobs    KeyJobs  `json:"jobs"`
	// Retryable says whether RetryKey would accept the key, and Why not.
	Retryable bool   `json:"retryable"`
	WhyNot    string `json:"retry_refused_because,omitempty"`
}

const keyColumns = `k.id, k.created_at, k.user_id, k.idempotency_key, k.recovery_point, k.request_method,
       k.request_path, k.request_params, k.request_fingerprint, k.upstream_idempotency_key::text, k.last_run_at,
       k.locked_at, k.response_code, k.response_body::text, k.completer_attempts, k.completer_next_attempt_at,
       k.completer_leased_until, k.completer_last_error, k.completer_gave_up_at`

// keyQuery selects ref's key, through the primary key or the
// (user_id, idempotency_key) unique index, followed by suffix.
func keyQuery(ref KeyRef, suffix string) (string, []any) {
	if ref.ID > 0 {
		return "SELECT " + keyColumns + " FROM idempotency_keys k WHERE k.id = $1" + suffix, []any{ref.ID}
	}
	return "SELECT " + keyColumns + " FROM idempotency_keys k WHERE k.user_id = $1 AND k.idempotency_key = $2" + suffix, []any{ref.UserID, ref.Key}
}

func scanKey(row pgx.Row) (*Key, error) {
	var k Key
	err := row.Scan(&k.ID, &k.CreatedAt, &k.UserID, &k.IdempotencyKey, &k.RecoveryPoint, &k.RequestMethod,
		&k.RequestPath, &k.RequestParams, &k.RequestFingerprint, &k.UpstreamIdempotencyKey, &k.LastRunAt,
		&k.LockedAt, &k.ResponseCode, &k.ResponseBody, &k.CompleterAttempts, &k.CompleterNextAttemptAt,
		&k.CompleterLeasedUntil, &k.CompleterLastError, &k.CompleterGaveUpAt)
	if err != nil {
		return nil, err
	}
	return &k, nil
}

// ReviewColumns are the columns ScanReviews reads, in its order.
const ReviewColumns = `id, key_id, user_id, idempotency_key, reason, detail, snapshot->>'recovery_point',
       flagged_by, flagged_at, extract(epoch FROM now() - flagged_at)::float8,
       resolved_at, resolved_by, resolution_note, snapshot`

// ScanReviews collects rows selected as ReviewColumns; none is [], not
// nil, so JSON shows an empty list.
func ScanReviews(rows pgx.Rows) ([]Review, error) {
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Review, error) {
		var v Review
		err := r.Scan(&v.ID, &v.KeyID, &v.UserID, &v.IdempotencyKey, &v.Reason, &v.Detail, &v.RecoveryPoint,
			&v.FlaggedBy, &v.FlaggedAt, &v.AgeSeconds, &v.ResolvedAt, &v.ResolvedBy, &v.ResolutionNote, &v.Snapshot)
		return v, err
	})
	if out == nil {
		out = []Review{}
	}
	return out, err
}

// ShowKey gathers a key's report in one read-only snapshot. A key that is
// gone but was reviewed is reported from its reviews (their snapshots hold
// the row as it was). giveUpAfter is the completer's --give-up-after.
func ShowKey(ctx context.Context, db TxDB, ref KeyRef, giveUpAfter time.Duration) (*KeyReport, error) {
	if p := ref.Check(); len(p) > 0 {
		return nil, fmt.Errorf("%w: %s", ErrRefused, strings.Join(p, "; "))
	}
	tx, err := db.Begin(ctx)
	if err != nil {
		return nil, fmt.Errorf("keys show: %w", err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // read-only
	if _, err := tx.Exec(ctx, "SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY"); err != nil {
		return nil, fmt.Errorf("keys show: %w", err)
	}
	rep := &KeyReport{Ref: ref.String(), GiveUpAfter: giveUpAfter.String(), Reviews: []Review{}, Actions: []Action{}}
	if err := tx.QueryRow(ctx, "SELECT now()").Scan(&rep.At); err != nil {
		return nil, fmt.Errorf("keys show: %w", err)
	}
	q, args := keyQuery(ref, "")
	k, err := scanKey(tx.QueryRow(ctx, q, args...))
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		k = nil
	case err != nil:
		return nil, fmt.Errorf("keys show: %w", err)
	}
	rep.Key = k
	rep.KeyID = ref.ID
	if k != nil {
		rep.KeyID = k.ID
	}

	// Reviews by key id (idempotency_key_reviews_key_id); for a gone key
	// named by user and key, by those (reviews keep them).
	var rows pgx.Rows
	if rep.KeyID > 0 {
		rows, err = tx.Query(ctx, "SELECT "+ReviewColumns+" FROM idempotency_key_reviews WHERE key_id = $1 ORDER BY flagged_at, id", rep.KeyID)
	} else {
		rows, err = tx.Query(ctx, "SELECT "+ReviewColumns+" FROM idempotency_key_reviews WHERE user_id = $1 AND idempotency_key = $2 ORDER BY flagged_at, id", ref.UserID, ref.Key)
	}
	if err != nil {
		return nil, fmt.Errorf("keys show: reviews: %w", err)
	}
	if rep.Reviews, err = ScanReviews(rows); err != nil {
		return nil, fmt.Errorf("keys show: reviews: %w", err)
	}
	if rep.KeyID == 0 && len(rep.Reviews) > 0 {
		rep.KeyID = rep.Reviews[len(rep.Reviews)-1].KeyID
	}
	if k == nil && len(rep.Reviews) == 0 {
		return nil, fmt.Errorf("%w: no %s, and no review of it", ErrNotFound, ref)
	}

	rep.State = KeyState(k, rep.At, giveUpAfter)
	rep.PastGiveUpHorizon = k != nil && giveUpAfter > 0 && !k.CreatedAt.Add(giveUpAfter).After(rep.At)
	if k != nil {
		if err := tx.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM idemd_unfinished_keys WHERE created_at = $1 AND key_id = $2)",
			k.CreatedAt, k.ID).Scan(&rep.Tracked); err != nil {
			return nil, fmt.Errorf("keys show: tracked: %w", err)
		}
	}
	if rep.Actions, err = listActions(ctx, tx, "key_id", rep.KeyID, 100); err != nil {
		return nil, fmt.Errorf("keys show: %w", err)
	}
	if rep.Jobs, err = keyJobs(ctx, tx, rep.KeyID); err != nil {
		return nil, fmt.Errorf("keys show: jobs: %w", err)
	}
	if why := retryRefusal(k, rep.Reviews, rep.At, giveUpAfter); why != "" {
		rep.WhyNot = why
	} else {
		rep.Retryable = true
	}
	return rep, nil
}

// keyJobs finds the jobs whose metadata names the key (KeyJobs). Each
// lookup is a containment query: staged_jobs and staged_jobs_dead are
// short, river_job has a GIN index on metadata (river_job_metadata_index).
func keyJobs(ctx context.Context, db DB, keyID int64) (KeyJobs, error) {
	jobs := KeyJobs{LinkKey: JobLinkKey, Note: jobsNote, Staged: []JobRef{}, Dead: []JobRef{}, River: []JobRef{}}
	if keyID == 0 {
		return jobs, nil
	}
	link, _ := json.Marshal(map[string]int64{JobLinkKey: keyID})
	var err error
	jobs.Staged, err = collectJobs(ctx, db, `
SELECT id, job_name, 'staged', queue, NULL::int, created_at, NULL::timestamptz, NULL::bigint, NULL::text
FROM staged_jobs WHERE metadata @> $1::jsonb ORDER BY id LIMIT 100`, link)
	if err != nil {
		return jobs, err
	}
	jobs.Dead, err = collectJobs(ctx, db, `
SELECT id, job_name, 'dead', queue, NULL::int, created_at, dead_at, NULL::bigint, reason
FROM staged_jobs_dead WHERE metadata @> $1::jsonb ORDER BY id LIMIT 100`, link)
	if err != nil {
		return jobs, err
	}
	jobs.River, err = riverJobs(ctx, db, link)
	return jobs, err
}

// riverJobs lists the River jobs whose metadata contains filter.
func riverJobs(ctx context.Context, db DB, filter []byte) ([]JobRef, error) {
	return collectJobs(ctx, db, riverdb.JobsByMetadataSQL, filter)
}

func collectJobs(ctx context.Context, db DB, sql string, args ...any) ([]JobRef, error) {
	rows, err := db.Query(ctx, sql, args...)
	if err != nil {
		return nil, err
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (JobRef, error) {
		var j JobRef
		err := r.Scan(&j.ID, &j.Kind, &j.State, &j.Queue, &j.Attempt, &j.CreatedAt, &j.DoneAt, &j.StagedID, &j.Reason)
		return j, err
	})
	if out == nil {
		out = []JobRef{}
	}
	return out, err
}

// retryRefusal says why RetryKey would refuse the key ("" when it would
// not). It is the one place the rule is written; ShowKey reports it and
// RetryKey enforces it on the locked row.
func retryRefusal(k *Key, reviews []Review, now time.Time, giveUpAfter time.Duration) string {
	openReview := false
	for _, r := range reviews {
		if r.Open() && r.Reason == review.ReasonCompleterGaveUp {
			openReview = true
		}
	}
	switch {
	case k == nil:
		return "the key is gone (reaped); only its reviews remain: resolve them with what was done by hand"
	case k.RecoveryPoint == "finished":
		return "the key is finished: the API completed the request, there is nothing to retry"
	case k.CompleterLeasedUntil != nil && k.CompleterLeasedUntil.After(now):
		return fmt.Sprintf("a completer replica is replaying the key right now (its lease ends %s); look again after that", k.CompleterLeasedUntil.UTC().Format(time.RFC3339))
	case giveUpAfter > 0 && !k.CreatedAt.Add(giveUpAfter).After(now):
		return fmt.Sprintf("the key is "+horizonExplanation+"; finish it by hand and resolve its review", giveUpAfter)
	case k.CompleterGaveUpAt == nil && !openReview && k.CompleterAttempts == 0 && k.CompleterNextAttemptAt == nil:
		return "the completer has neither given up on the key nor failed on it: it takes the key when it is due, there is nothing to reset"
	}
	return ""
}

// RetryRequest asks RetryKey to hand a key back to the completer.
type RetryRequest struct {
	Ref   KeyRef
	Actor Actor
	Note  string
	// GiveUpAfter is the completer's --give-up-after: a key older than this
	// would be given up again at its next claim, so it is refused.
	GiveUpAfter time.Duration
}

// RetryResult is what RetryKey did.
type RetryResult struct {
	KeyID            int64     `json:"key_id"`
	ActionID         int64     `json:"action_id"`
	At               time.Time `json:"at"`
	By               string    `json:"by"`
	ResolvedReviews  []int64   `json:"resolved_reviews"`
	PreviousAttempts int32     `json:"previous_attempts"`
	WasGivenUp       bool      `json:"was_given_up"`
}

// retryLockTimeout bounds the wait for the key's row lock (an API phase
// holding it): an operator gets an answer rather than a hang.
const retryLockTimeout = "5s"

// RetryKey hands a given-up or failing key back to the completer, in one
// transaction: it resets the columns the completer reads to decide it gave
// up (completer_gave_up_at, which internal/completer's unfinished
// excludes; completer_attempts, which --max-attempts is compared with;
// completer_next_attempt_at, when it is due), tracks the key again in
// idemd_unfinished_keys (the completer untracked it when it gave up),
// resolves the key's open completer_gave_up review (so a second give-up
// opens a new one rather than hiding behind the old), and records the
// action. completer_last_error is kept: it is history,
// not a decision. It refuses a finished key, a gone key, a key a completer
// replica has leased, and a key past the give-up horizon.
func RetryKey(ctx context.Context, db TxDB, req RetryRequest) (*RetryResult, error) {
	if p := req.Ref.Check(); len(p) > 0 {
		return nil, fmt.Errorf("%w: %s", ErrRefused, strings.Join(p, "; "))
	}
	if err := checkActor(req.Actor, req.Note); err != nil {
		return nil, err
	}
	var res *RetryResult
	err := pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "SET LOCAL lock_timeout = '"+retryLockTimeout+"'"); err != nil {
			return err
		}
		var now time.Time
		if err := tx.QueryRow(ctx, "SELECT now()").Scan(&now); err != nil {
			return err
		}
		q, args := keyQuery(req.Ref, " FOR UPDATE")
		k, err := scanKey(tx.QueryRow(ctx, q, args...))
		if errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("%w: no %s (a reaped key cannot be retried; resolve its review instead)", ErrNotFound, req.Ref)
		}
		if err != nil {
			return err
		}
		rows, err := tx.Query(ctx, "SELECT "+ReviewColumns+" FROM idempotency_key_reviews WHERE key_id = $1 AND resolved_at IS NULL", k.ID)
		if err != nil {
			return err
		}
		open, err := ScanReviews(rows)
		if err != nil {
			return err
		}
		if why := retryRefusal(k, open, now, req.GiveUpAfter); why != "" {
			return fmt.Errorf("%w: %s: %s", ErrRefused, req.Ref, why)
		}
		before, _ := json.Marshal(map[string]any{
			"recovery_point":            k.RecoveryPoint,
			"completer_attempts":        k.CompleterAttempts,
			"completer_next_attempt_at": k.CompleterNextAttemptAt,
			"completer_gave_up_at":      k.CompleterGaveUpAt,
			"completer_last_error":      k.CompleterLastError,
		})
		if _, err := tx.Exec(ctx, `
UPDATE idempotency_keys
SET completer_gave_up_at = NULL, completer_attempts = 0, completer_next_attempt_at = NULL
WHERE id = $1`, k.ID); err != nil {
			return err
		}
		// The completer walks idemd_unfinished_keys by the key's created_at.
		if _, err := tx.Exec(ctx, `INSERT INTO idemd_unfinished_keys (created_at, key_id) VALUES ($1, $2) ON CONFLICT DO NOTHING`,
			k.CreatedAt, k.ID); err != nil {
			return err
		}
		res = &RetryResult{KeyID: k.ID, By: req.Actor.By, PreviousAttempts: k.CompleterAttempts, WasGivenUp: k.CompleterGaveUpAt != nil, ResolvedReviews: []int64{}}
		res.ResolvedReviews, err = review.ResolveReason(ctx, tx, k.ID, review.ReasonCompleterGaveUp, req.Actor.By,
			"handed back to the completer ("+req.Actor.Via+" keys retry): "+req.Note)
		if err != nil {
			return err
		}
		var reviewID *int64
		if len(res.ResolvedReviews) > 0 {
			reviewID = &res.ResolvedReviews[0]
		}
		return tx.QueryRow(ctx, `
INSERT INTO idemd_operator_actions (actor, action, via, key_id, review_id, note, detail)
VALUES ($1, $2, $3, $4, $5, $6, $7) RETURNING id, at`,
			strings.TrimSpace(req.Actor.By), ActionKeyRetry, req.Actor.Via, k.ID, reviewID, req.Note, before).Scan(&res.ActionID, &res.At)
	})
	if err != nil {
		if errors.Is(err, ErrNotFound) || errors.Is(err, ErrRefused) {
			return nil, err
		}
		return nil, fmt.Errorf("keys retry: %w", err)
	}
	return res, nil
}
