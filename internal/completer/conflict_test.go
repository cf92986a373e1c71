package completer

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/idemd/idemd/idem/replayauth"
	"github.com/idemd/idemd/internal/review"
	"github.com/idemd/idemd/internal/testing/dbtest"
)

// runUntil runs passes until done says so, at most passes of them.
func runUntil(t *testing.T, svc *Service, passes int, what string, done func() bool) {
	t.Helper()
	for range passes {
		if done() {
			return
		}
		if _, err := svc.RunOnce(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	if !done() {
		t.Fatalf("%s: not after %d passes", what, passes)
	}
}

// reviewDetail is the detail of key's completer_gave_up review.
func reviewDetail(t *testing.T, pool *pgxpool.Pool, key string) string {
	t.Helper()
	var detail string
	if err := pool.QueryRow(context.Background(), `SELECT detail FROM idempotency_key_reviews WHERE idempotency_key = $1 AND reason = $2 AND flagged_by = 'completer'`,
		key, review.ReasonCompleterGaveUp).Scan(&detail); err != nil {
		t.Fatalf("review of %s: %v", key, err)
	}
	return detail
}

// A key whose replay can only ever meet the article's parameter-mismatch
// 409 (the key is not locked) is given up after --max-attempts and
// flagged, the review naming the mismatch; a key a live request holds
// (409, locked) is left alone without an attempt.
func TestMismatchConflictIsGivenUp(t *testing.T) {
	pool := dbtest.NewPool(t)
	insertKeys(t, pool, "mm", 2, "started")
	api := newTestAPI(t, pool, func(k string, _ int) action {
		if k == "mm-1" {
			return actMismatch
		}
		return actConflict
	})
	cfg := testConfig(api.srv.URL)
	cfg.MaxAttempts = 3
	cfg.LockTimeout = time.Minute // the test API's lock is a live request's
	svc := newTestService(t, pool, cfg)
	runUntil(t, svc, 10, "mismatch key given up", func() bool { return getKey(t, pool, "mm-1").GaveUp != nil })

	if r := getKey(t, pool, "mm-1"); r.Attempts != 3 || r.RecoveryPoint != "started" || r.LastError == nil || !strings.Contains(*r.LastError, "parameter mismatch") {
		t.Fatalf("mismatch key %+v", r)
	}
	api.mu.Lock()
	mismatches, held := api.perKey["mm-1"], api.perKey["mm-2"]
	api.mu.Unlock()
	if mismatches != 3 {
		t.Fatalf("mismatch key replayed %d times, want --max-attempts 3", mismatches)
	}
	if d := reviewDetail(t, pool, "mm-1"); !strings.Contains(d, "3 failed attempts (--max-attempts 3)") || !strings.Contains(d, "409 Conflict while no request held the key") || !strings.Contains(d, "parameter mismatch") {
		t.Fatalf("review detail %q does not name the mismatch", d)
	}
	// The held key: one replay, in progress, no attempt, not flagged.
	if r := getKey(t, pool, "mm-2"); held != 1 || r.Attempts != 0 || r.GaveUp != nil || r.NextAttempt == nil || r.LastError != nil {
		t.Fatalf("held key replayed %d times: %+v; want once, in progress", held, r)
	}
	if n := countWhere(t, pool, "completer_gave_up_at IS NOT NULL"); n != 1 {
		t.Fatalf("%d keys given up, want 1", n)
	}
}

// A JSON replay refused with 422 by an API that reads form bodies: the
// log line of the failed attempt and the give-up's review say the request
// encoding may be wrong and name the current one.
func TestWrongEncodingIsNamed(t *testing.T) {
	for _, code := range []int{http.StatusUnprocessableEntity, http.StatusUnsupportedMediaType} {
		t.Run(fmt.Sprint(code), func(t *testing.T) {
			pool := dbtest.NewPool(t)
			insertKeys(t, pool, "enc", 1, "started")
			api := newTestAPI(t, pool, always(actFinish))
			api.form, api.refuseType = true, code
			core, logs := observer.New(zap.InfoLevel)
			cfg := testConfig(api.srv.URL)
			cfg.Logger = zap.New(core)
			cfg.MaxAttempts = 2
			svc := newTestService(t, pool, cfg)
			runUntil(t, svc, 5, "key given up", func() bool { return getKey(t, pool, "enc-1").GaveUp != nil })

			const hint = "the request encoding may be wrong: replays are sent as --request-encoding json (application/json); if the API reads form bodies, set --request-encoding form"
			retried := logs.FilterMessage("replay failed, will retry").All()
			if len(retried) != 1 || !strings.Contains(retried[0].ContextMap()["error"].(string), hint) {
				t.Fatalf("failed-attempt log lines %v, want one naming the encoding", retried)
			}
			gaveUp := logs.FilterMessage("gave up on key, flagged for review").All()
			if len(gaveUp) != 1 || !strings.Contains(gaveUp[0].ContextMap()["detail"].(string), hint) {
				t.Fatalf("give-up log lines %v, want one naming the encoding", gaveUp)
			}
			if d := reviewDetail(t, pool, "enc-1"); !strings.Contains(d, hint) || !strings.Contains(d, fmt.Sprint(code)) {
				t.Fatalf("review detail %q does not name the encoding", d)
			}
			// The hint is right: form encoding finishes a key.
			insertKeys(t, pool, "enc-form", 1, "started")
			cfg.Encoding = EncodingForm
			if res, err := newTestService(t, pool, cfg).RunOnce(context.Background()); err != nil || res.Finished != 1 {
				t.Fatalf("with --request-encoding form: %+v %v", res, err)
			}
		})
	}
}

// serialAPI is an API in the article's style on real PostgreSQL: its
// phases run SERIALIZABLE, it answers 409 both to a key a live request
// holds and to a serialization failure (after unlocking the key, so a
// retry may run), and its ride phase reads every earlier ride before
// inserting one, so two rides in flight at once conflict. It counts its
// answers; serial_rides (one row per key at most) is its side effect.
type serialAPI struct {
	pool        *pgxpool.Pool
	verifier    *replayauth.Verifier
	srv         *httptest.Server
	lockTimeout time.Duration

	mu         sync.Mutex
	conflicts  int // 409s for serialization failures
	inProgress int // 409s for a held key
	rides      int // 201s
	other      int // anything else
}

func newSerialAPI(t *testing.T, pool *pgxpool.Pool, lockTimeout time.Duration) *serialAPI {
	t.Helper()
	// The API's own table, created as the migrator so the runtime role
	// the pool uses may write it.
	if _, err := dbtest.MigratorPool(t, pool).Exec(context.Background(), `CREATE TABLE serial_rides (key_id bigint PRIMARY KEY, seq bigint NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	v, err := replayauth.NewVerifier(0, mustSecret(t, testSecret))
	if err != nil {
		t.Fatal(err)
	}
	a := &serialAPI{pool: pool, verifier: v, lockTimeout: lockTimeout}
	a.srv = httptest.NewServer(http.HandlerFunc(a.serve))
	t.Cleanup(a.srv.Close)
	return a
}

var errHeld = errors.New("held by a live request")

func isSerializationFailure(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && (pe.Code == "40001" || pe.Code == "40P01")
}

func (a *serialAPI) count(n *int) {
	a.mu.Lock()
	*n++
	a.mu.Unlock()
}

func (a *serialAPI) serve(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	body, _ := io.ReadAll(r.Body)
	key := r.Header.Get(replayauth.IdempotencyKeyHeader)
	uid, err := a.verifier.Verify(ctx, r.Header.Get(replayauth.Header), replayauth.Request{Method: r.Method, Path: r.URL.Path, IdempotencyKey: key, Body: body})
	if err != nil {
		a.count(&a.other)
		http.Error(w, "unauthorized", http.StatusUnauthorized)
		return
	}
	serializable := pgx.TxOptions{IsoLevel: pgx.Serializable}
	var id int64
	var finished bool
	// Phase 1: look the key up and lock it, unless a live request holds it.
	err = pgx.BeginTxFunc(ctx, a.pool, serializable, func(tx pgx.Tx) error {
		var held bool
		if err := tx.QueryRow(ctx, `
SELECT id, recovery_point = 'finished', locked_at IS NOT NULL AND locked_at > now() - $3::interval
FROM idempotency_keys WHERE user_id = $1 AND idempotency_key = $2`, uid, key, a.lockTimeout).Scan(&id, &finished, &held); err != nil {
			return err
		}
		if finished {
			return nil
		}
		if held {
			return errHeld
		}
		_, err := tx.Exec(ctx, `UPDATE idempotency_keys SET locked_at = now(), last_run_at = now() WHERE id = $1`, id)
		return err
	})
	if err == nil && !finished {
		// Phase 2: the ride, numbered after every earlier one, and the
		// key finished with it.
		err = pgx.BeginTxFunc(ctx, a.pool, serializable, func(tx pgx.Tx) error {
			var n int64
			if err := tx.QueryRow(ctx, `SELECT count(*) FROM serial_rides`).Scan(&n); err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, `INSERT INTO serial_rides (key_id, seq) VALUES ($1, $2)`, id, n+1); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, `UPDATE idempotency_keys SET recovery_point = 'finished', response_code = 201, response_body = '{}', locked_at = NULL WHERE id = $1`, id)
			return err
		})
	}
	switch {
	case errors.Is(err, errHeld):
		a.count(&a.inProgress)
		http.Error(w, "in progress", http.StatusConflict)
	case isSerializationFailure(err):
		// The article's atomic_phase: unlock right away so a retry may
		// run, answer 409.
		if _, uerr := a.pool.Exec(context.WithoutCancel(ctx), `UPDATE idempotency_keys SET locked_at = NULL WHERE id = $1`, id); uerr != nil {
			a.count(&a.other)
			http.Error(w, uerr.Error(), http.StatusInternalServerError)
			return
		}
		a.count(&a.conflicts)
		http.Error(w, "conflict, retry", http.StatusConflict)
	case err != nil:
		a.count(&a.other)
		http.Error(w, err.Error(), http.StatusInternalServerError)
	default:
		a.count(&a.rides)
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write([]byte("{}"))
	}
}

// conflictRun drains n abandoned keys through a serialAPI and returns how
// many serialization-failure 409s the API answered, and the completer's
// log of backoff episodes.
type conflictRun struct {
	conflicts, inProgress, rides, other int
	backoffs, recoveries                []observer.LoggedEntry
	gaugeAtEnd                          float64
}

func drainSerial(t *testing.T, n int, adaptive bool) conflictRun {
	t.Helper()
	pool := dbtest.NewPool(t)
	api := newSerialAPI(t, pool, DefaultSettings().LockTimeout)
	insertKeys(t, pool, "ser", n, "started")
	core, logs := observer.New(zap.InfoLevel)
	cfg := testConfig(api.srv.URL)
	cfg.Logger = zap.New(core)
	// The defaults the issue was met with, and the API's own lock
	// timeout (the keys' locks are an hour old).
	def := DefaultSettings()
	cfg.Concurrency, cfg.MaxAttempts, cfg.LockTimeout, cfg.InProgressDelay = def.Concurrency, def.MaxAttempts, def.LockTimeout, def.InProgressDelay
	svc := newTestService(t, pool, cfg)
	if !adaptive {
		// The fixed baseline: replays in flight stay at --concurrency.
		// It may need more attempts than the default allows to finish
		// every key; counting its conflicts needs it to finish.
		svc.conc = newGate(newAIMD(cfg.Concurrency, false))
		svc.cfg.MaxAttempts = 1000
	}
	runUntil(t, svc, 2000, "every key finished", func() bool {
		return countWhere(t, pool, "recovery_point <> 'finished'") == 0 || countWhere(t, pool, "completer_gave_up_at IS NOT NULL") > 0
	})
	// The oracle: every key finished by exactly one ride, none given up.
	var rides, keysRidden int
	if err := pool.QueryRow(context.Background(), `SELECT count(*), count(DISTINCT k.id) FROM serial_rides r JOIN idempotency_keys k ON k.id = r.key_id WHERE k.recovery_point = 'finished' AND k.response_code = 201`).Scan(&rides, &keysRidden); err != nil {
		t.Fatal(err)
	}
	if gaveUp := countWhere(t, pool, "completer_gave_up_at IS NOT NULL"); rides != n || keysRidden != n || gaveUp != 0 {
		t.Fatalf("adaptive %v: %d rides for %d finished keys of %d, %d given up", adaptive, rides, keysRidden, n, gaveUp)
	}
	api.mu.Lock()
	defer api.mu.Unlock()
	// Every serialization-failure 409 was an attempt of its key (none was
	// taken for a live request's), and nothing else was.
	var attempts int
	if err := pool.QueryRow(context.Background(), `SELECT coalesce(sum(completer_attempts), 0) FROM idempotency_keys`).Scan(&attempts); err != nil {
		t.Fatal(err)
	}
	if attempts != api.conflicts {
		t.Fatalf("adaptive %v: %d attempts recorded for %d conflicts answered", adaptive, attempts, api.conflicts)
	}
	return conflictRun{
		conflicts: api.conflicts, inProgress: api.inProgress, rides: api.rides, other: api.other,
		backoffs:   logs.FilterMessageSnippet("lowering replay concurrency").All(),
		recoveries: logs.FilterMessageSnippet("concurrency back at --concurrency").All(),
		gaugeAtEnd: testutil.ToFloat64(svc.metrics.concurrencyLimit),
	}
}

// An API whose SERIALIZABLE phases conflict when replays overlap: the
// completer at its defaults (--concurrency 8) lowers its concurrency as
// the conflicts come and finishes every key with fewer conflicts than a
// fixed concurrency of 8 does, logging each backoff episode once. The
// API's own counts and the rides table are the oracle.
func TestAdaptiveConcurrencyUnderSerializationConflicts(t *testing.T) {
	if testing.Short() {
		t.Skip("drains two backlogs through a real API")
	}
	const n = 150
	fixed := drainSerial(t, n, false)
	adaptive := drainSerial(t, n, true)
	t.Logf("fixed 8: %d conflicts for %d rides; adaptive: %d conflicts for %d rides, %d backoff episodes, %d recoveries, limit at the end %v",
		fixed.conflicts, fixed.rides, adaptive.conflicts, adaptive.rides, len(adaptive.backoffs), len(adaptive.recoveries), adaptive.gaugeAtEnd)
	for _, r := range []conflictRun{fixed, adaptive} {
		if r.rides != n || r.other != 0 || r.inProgress != 0 {
			t.Fatalf("API answers %+v: want %d rides and only conflicts besides", r, n)
		}
	}
	if fixed.conflicts == 0 {
		t.Fatal("the test API's phases never conflicted at a fixed concurrency of 8: the test shows nothing")
	}
	if adaptive.conflicts >= fixed.conflicts {
		t.Fatalf("adaptive concurrency met %d conflicts, a fixed 8 met %d", adaptive.conflicts, fixed.conflicts)
	}
	// Backoff is logged once per episode: an episode ends (the limit
	// back at 8) before the next begins, and an episode halves the limit
	// on more conflicts than it logs.
	if len(adaptive.backoffs) == 0 || len(adaptive.backoffs) > len(adaptive.recoveries)+1 || len(adaptive.backoffs) >= adaptive.conflicts {
		t.Fatalf("%d backoff log lines, %d recoveries, %d conflicts", len(adaptive.backoffs), len(adaptive.recoveries), adaptive.conflicts)
	}
	if first := adaptive.backoffs[0].ContextMap(); first["from"] != int64(8) || first["to"] != int64(4) {
		t.Fatalf("first backoff %v, want from 8 to 4", first)
	}
	if len(fixed.backoffs) != 0 {
		t.Fatalf("the fixed baseline logged %d backoffs", len(fixed.backoffs))
	}
}
