package conformance

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"reflect"
	"strings"
	"sync"
	"time"

	"github.com/idemd/idemd/idem/replayauth"
)

// need is what a scenario needs beyond the API's URL and the template.
type need int

const (
	needDB need = 1 << iota
	needSecret
	needSecondUser
)

// Scenario is one claim checked against the API.
type Scenario struct {
	Name      string
	Rationale string // one line: why an API must do this
	Doc       string // the section of the docs that says so
	Needs     need
	// Check returns a note for a pass, or why the API failed.
	Check func(ctx context.Context, r *run) (string, error)
}

const doc = "docs/api-authors.md"

// Scenarios are every scenario, in the order they run and are reported.
// replay comes first: an API that ignores Idempotency-Key fails it before
// anything else, and that is the one failure to read first.
func Scenarios() []Scenario {
	return []Scenario{
		{Name: "replay", Rationale: "a retry with the same key returns the first response (status and body) without doing the work again",
			Doc: doc + "#what-a-replay-returns", Check: checkReplay},
		{Name: "stored-response", Rationale: "the first request finishes its key: recovery point finished, unlocked, its status and body stored",
			Doc: doc + "#atomic-phases", Needs: needDB, Check: checkStored},
		{Name: "params-mismatch", Rationale: "the same key with other parameters is refused (400, 409 or 422), never run and never answered with the first response",
			Doc: doc + "#status-codes", Check: checkMismatch},
		{Name: "key-required", Rationale: "a missing, empty or over-long Idempotency-Key is refused with 400 before any work",
			Doc: doc + "#status-codes", Check: checkKeyRequired},
		{Name: "concurrent", Rationale: "of requests racing with one key one does the work; a request finding the key held gets 409",
			Doc: doc + "#begin-lock-or-insert-the-key", Check: checkConcurrent},
		{Name: "per-user", Rationale: "keys belong to a user: another user's request with the same key value is a new request",
			Doc: doc + "#begin-lock-or-insert-the-key", Needs: needSecondUser, Check: checkPerUser},
		{Name: "staged-jobs", Rationale: "jobs are staged in a phase's transaction: committed when the answer arrives, never again on a retry, one River job each",
			Doc: doc + "#stagejob", Needs: needDB, Check: checkStagedJobs},
		{Name: "abandoned-resume", Rationale: "a key abandoned after its claim (unlocked, or locked by a request that crashed) is resumed by the client's retry and finished",
			Doc: doc + "#begin-lock-or-insert-the-key", Needs: needDB, Check: checkAbandonedResume},
		{Name: "replay-signed", Rationale: "the completer's signed replay of an abandoned key is accepted and finishes the key",
			Doc: doc + "#the-completers-replay-path", Needs: needDB | needSecret, Check: checkSignedReplay},
		{Name: "replay-forged", Rationale: "a replay signed with another secret is refused (401) and changes nothing",
			Doc: doc + "#the-replay-signature-for-a-verifier-in-another-language", Needs: needDB | needSecret, Check: checkForged},
		{Name: "replay-tampered", Rationale: "a signed replay whose body was changed after signing is refused (401) and changes nothing",
			Doc: doc + "#the-replay-signature-for-a-verifier-in-another-language", Needs: needDB | needSecret, Check: checkTampered},
		{Name: "replay-expired", Rationale: "a signature older than the skew window is refused (401) and changes nothing",
			Doc: doc + "#the-replay-signature-for-a-verifier-in-another-language", Needs: needDB | needSecret, Check: checkExpired},
		{Name: "replay-foreign-user", Rationale: "a signature naming a user who does not own the key is refused (401) and changes nothing",
			Doc: doc + "#the-completers-replay-path", Needs: needDB | needSecret, Check: checkForeignUser},
		{Name: "replay-nonce", Rationale: "a signature accepted once is refused when sent again (its nonce is spent)",
			Doc: doc + "#nonces", Needs: needDB | needSecret, Check: checkNonce},
	}
}

// scenarioNamed is the scenario called name, nil if none.
func scenarioNamed(name string) *Scenario {
	for _, s := range Scenarios() {
		if s.Name == name {
			return &s
		}
	}
	return nil
}

// first sends the template's request with key and fails unless the API
// accepts it.
func (r *run) first(ctx context.Context, key string) (answer, error) {
	a, err := r.send(ctx, req{key: key})
	if err != nil {
		return answer{}, err
	}
	if !a.ok() {
		return a, failf("the request with a new key answered %s: the template must describe a request that succeeds", a)
	}
	return a, nil
}

// seedRow is a finished key of the API's, written for the template's
// request: the model of every key the run makes itself.
func (r *run) seedRow(ctx context.Context) (keyRow, error) {
	if r.seed != nil {
		return *r.seed, nil
	}
	key := r.key("seed")
	if _, err := r.first(ctx, key); err != nil {
		return keyRow{}, err
	}
	row, err := r.db.one(ctx, key)
	if err != nil {
		return keyRow{}, failf("no key row to make an abandoned key from: %v", err)
	}
	if row.recoveryPoint != "finished" {
		return keyRow{}, failf("no finished key to make an abandoned key from: the API left its key at %q", row.recoveryPoint)
	}
	r.seed = &row
	return row, nil
}

func checkReplay(ctx context.Context, r *run) (string, error) {
	key := r.key("replay")
	a1, err := r.first(ctx, key)
	if err != nil {
		return "", err
	}
	var rows []keyRow
	if r.db != nil {
		if rows, err = r.db.keys(ctx, key); err != nil {
			return "", err
		}
	}
	a2, err := r.send(ctx, req{key: key})
	if err != nil {
		return "", err
	}
	if a2.status != a1.status || a2.body != a1.body {
		return "", failf("the retry answered %s, the first request %s: a retry must get the stored status and body, byte for byte", a2, a1)
	}
	if r.db != nil {
		if len(rows) != 1 {
			return "", failf("idempotency_keys has %d rows with the key, want 1: a retry can only be answered from the stored key", len(rows))
		}
		if err := r.db.unchanged(ctx, rows[0], "the retry got the first answer"); err != nil {
			return "", err
		}
	}
	if !a2.replayed {
		return "the retry carries no Idempotent-Replayed: true (optional)", nil
	}
	return "", nil
}

func checkStored(ctx context.Context, r *run) (string, error) {
	key := r.key("stored")
	a, err := r.first(ctx, key)
	if err != nil {
		return "", err
	}
	row, err := r.db.one(ctx, key)
	if err != nil {
		return "", err
	}
	t := r.cfg.Template
	switch {
	case row.recoveryPoint != "finished":
		return "", failf("the key is at recovery point %q after the API answered %s, want finished", row.recoveryPoint, a)
	case row.locked:
		return "", failf("the key is finished but still locked (locked_at set): finishing must unlock it")
	case row.code == nil || *row.code != a.status:
		return "", failf("stored response_code %v, the API answered %d", deref(row.code), a.status)
	case row.body == nil || (*row.body != a.body && !jsonEqual(*row.body, a.body)):
		stored := "NULL"
		if row.body != nil {
			stored = clip(*row.body)
		}
		return "", failf("stored response_body %s, the API answered %s", stored, clip(a.body))
	case row.method != t.Method || row.path != t.Path:
		return "", failf("stored request %s %s, sent %s %s: the completer replays what is stored", row.method, row.path, t.Method, t.Path)
	}
	return "", nil
}

func checkMismatch(ctx context.Context, r *run) (string, error) {
	// The other parameters must be a request the API accepts, or the
	// refusal below would be their validation error.
	alt, err := r.send(ctx, req{key: r.key("mismatch-alt"), body: r.cfg.Template.AltBody})
	if err != nil {
		return "", err
	}
	if !alt.ok() {
		return "", failf("the other parameters alone (alt_body, or the body with one value changed) answered %s: give alt_body, other parameters the API accepts", alt)
	}
	key := r.key("mismatch")
	a1, err := r.first(ctx, key)
	if err != nil {
		return "", err
	}
	var row keyRow
	if r.db != nil {
		if row, err = r.db.one(ctx, key); err != nil {
			return "", err
		}
	}
	a2, err := r.send(ctx, req{key: key, body: r.cfg.Template.AltBody})
	if err != nil {
		return "", err
	}
	whose, refused := MismatchStatuses[a2.status]
	if pinned := r.cfg.MismatchStatus; pinned != 0 && a2.status != pinned || !refused {
		what := "a reused key must never run other parameters"
		if a2.status == a1.status && a2.body == a1.body {
			what = "it was answered with the first request's response, as if it were that request"
		} else if refused {
			what = fmt.Sprintf("a refusal, but --mismatch-status pins %d", r.cfg.MismatchStatus)
		}
		want := "one of " + mismatchStatusList()
		if r.cfg.MismatchStatus != 0 {
			want = fmt.Sprint(r.cfg.MismatchStatus)
		}
		return "", failf("the same key with other parameters answered %s, want %s: %s", a2, want, what)
	}
	note := fmt.Sprintf("answered %d, %s choice", a2.status, whose)
	if r.db != nil {
		return note, r.db.unchanged(ctx, row, fmt.Sprintf("the API answered %d", a2.status))
	}
	return note, nil
}

func checkKeyRequired(ctx context.Context, r *run) (string, error) {
	long := r.key("long") + "-" + strings.Repeat("k", 256)
	cases := []struct {
		what string
		q    req
	}{
		{"no Idempotency-Key header", req{mode: noKeyHeader}},
		{"an empty Idempotency-Key", req{key: ""}},
		{fmt.Sprintf("a %d-character Idempotency-Key", len(long)), req{key: long}},
	}
	var bad []string
	for _, c := range cases {
		a, err := r.send(ctx, c.q)
		if err != nil {
			return "", err
		}
		if a.status != http.StatusBadRequest {
			bad = append(bad, fmt.Sprintf("%s answered %s", c.what, a))
		}
	}
	if r.db != nil {
		rows, err := r.db.keys(ctx, long)
		if err != nil {
			return "", err
		}
		if len(rows) > 0 {
			bad = append(bad, "the over-long key was stored")
		}
	}
	if len(bad) > 0 {
		return "", failf("%s; want 400", strings.Join(bad, "; "))
	}
	return "", nil
}

func checkConcurrent(ctx context.Context, r *run) (string, error) {
	key := r.key("concurrent")
	n := r.cfg.Concurrency
	answers := make([]answer, n)
	errs := make([]error, n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			answers[i], errs[i] = r.send(ctx, req{key: key})
		}()
	}
	close(start)
	wg.Wait()
	// Answers marked Idempotent-Replayed are replays (whose bodies are the
	// replay scenario's business); the others each claim to have done the
	// work, so they must all be one answer.
	var done []answer
	conflicts := 0
	for i, a := range answers {
		switch {
		case errs[i] != nil:
			return "", errs[i]
		case a.status == http.StatusConflict:
			conflicts++
		case a.ok() && a.replayed:
		case a.ok():
			done = append(done, a)
		default:
			return "", failf("one of %d requests racing with one key answered %s, want the stored response or 409", n, a)
		}
	}
	if conflicts == n {
		return "", failf("none of %d requests racing with one key succeeded: each answered 409", n)
	}
	for _, a := range done[min(1, len(done)):] {
		if a.status != done[0].status || a.body != done[0].body {
			return "", failf("requests racing with one key got different answers (%s and %s): the key ran more than once", done[0], a)
		}
	}
	note := fmt.Sprintf("%d of %d racing requests got 409", conflicts, n)
	if r.db == nil {
		if conflicts == 0 {
			with := "--database-url adds"
			if r.noSchema != "" {
				with = "idemd's schema (`idemctl migrate`) lets --database-url add"
			}
			note += " (the first finished before the others arrived; " + with + " a check that does not depend on timing)"
		}
		return note, nil
	}
	if _, err := r.db.one(ctx, key); err != nil {
		return "", err
	}
	// Without timing: a key another request holds right now.
	seed, err := r.seedRow(ctx)
	if err != nil {
		return "", err
	}
	held, err := r.db.clone(ctx, seed, r.key("held"), lockedNow)
	if err != nil {
		return "", err
	}
	a, err := r.send(ctx, req{key: held.key})
	if err != nil {
		return "", err
	}
	if a.status != http.StatusConflict {
		return "", failf("a request whose key another request holds (locked just now) answered %s, want 409: two requests with one key must never both run", a)
	}
	return note, r.db.unchanged(ctx, held, "the API answered 409")
}

func checkPerUser(ctx context.Context, r *run) (string, error) {
	key := r.key("per-user")
	a1, err := r.first(ctx, key)
	if err != nil {
		return "", err
	}
	a2, err := r.send(ctx, req{key: key, headers: r.cfg.Template.SecondUser.Headers})
	if err != nil {
		return "", err
	}
	if !a2.ok() {
		return "", failf("the second user's request with the first user's key value answered %s: it is a new request of theirs", a2)
	}
	if a2.replayed {
		return "", failf("the second user was answered the first user's stored response (Idempotent-Replayed: true): keys must be scoped per user")
	}
	if r.db == nil {
		if a2.body == a1.body {
			return "the two answers are identical; --database-url tells a replay from a new request", nil
		}
		return "", nil
	}
	rows, err := r.db.keys(ctx, key)
	if err != nil {
		return "", err
	}
	if len(rows) != 2 || rows[0].userID == rows[1].userID {
		return "", failf("idempotency_keys has %d row(s) for the key value after two users sent it, want one per user", len(rows))
	}
	return "", nil
}

func checkStagedJobs(ctx context.Context, r *run) (string, error) {
	m0, err := r.db.jobMark(ctx)
	if err != nil {
		return "", err
	}
	key := r.key("jobs")
	if _, err := r.first(ctx, key); err != nil {
		return "", err
	}
	staged, err := r.db.jobsSince(ctx, m0)
	if err != nil {
		return "", err
	}
	m1 := m0
	for _, id := range staged {
		m1 = max(m1, id)
	}
	if _, err := r.send(ctx, req{key: key}); err != nil {
		return "", err
	}
	again, err := r.db.jobsSince(ctx, m1)
	if err != nil {
		return "", err
	}
	if len(again) > 0 {
		return "", failf("the retry staged %d more job(s) (staged_jobs ids %v): a job belongs in a phase's transaction, which a replay does not run", len(again), again)
	}
	twice, err := r.db.riverTwice(ctx, staged)
	if err != nil {
		return "", err
	}
	if len(twice) > 0 {
		return "", failf("staged job(s) %v became more than one River job", twice)
	}
	note := fmt.Sprintf("%d job(s) staged, committed when the answer arrived", len(staged))
	if len(staged) == 0 {
		note = "the request staged no job"
	}
	if !r.db.dead || !r.db.river {
		note += "; staged_jobs_dead or river_job not readable by this role, so jobs the enqueuer moved meanwhile are not seen"
	}
	return note, nil
}

func checkAbandonedResume(ctx context.Context, r *run) (string, error) {
	seed, err := r.seedRow(ctx)
	if err != nil {
		return "", err
	}
	for _, c := range []struct {
		lock lockState
		what string
	}{
		{unlocked, "left unlocked at recovery point started"},
		{lockedStale, "whose request crashed an hour ago holding its lock, at recovery point started"},
	} {
		k, err := r.db.clone(ctx, seed, r.key("abandoned-"+string(c.lock)), c.lock)
		if err != nil {
			return "", err
		}
		a, err := r.send(ctx, req{key: k.key})
		if err != nil {
			return "", err
		}
		if !a.ok() {
			return "", failf("the client's retry of a key %s answered %s: it must resume the key", c.what, a)
		}
		after, err := r.db.byID(ctx, k.id)
		if err != nil {
			return "", err
		}
		if after.recoveryPoint != "finished" {
			return "", failf("the client's retry of a key %s answered %s but left the key at %q", c.what, a, after.recoveryPoint)
		}
	}
	return "", nil
}

// signer signs as the completer does, with every secret.
func (r *run) signer() (*replayauth.Signer, error) {
	return replayauth.NewSigner(r.cfg.Secrets...)
}

// abandoned makes an abandoned key and the body the completer would
// replay it with.
func (r *run) abandoned(ctx context.Context, scenario string) (keyRow, []byte, string, error) {
	seed, err := r.seedRow(ctx)
	if err != nil {
		return keyRow{}, nil, "", err
	}
	k, err := r.db.clone(ctx, seed, r.key(scenario), unlocked)
	if err != nil {
		return keyRow{}, nil, "", err
	}
	body, ctype, err := r.encode([]byte(k.params))
	if err != nil {
		return keyRow{}, nil, "", fmt.Errorf("encode the stored params: %w", err)
	}
	return k, body, ctype, nil
}

func (r *run) replayRequest(k keyRow, body []byte) replayauth.Request {
	return replayauth.Request{Method: k.method, Path: k.path, UserID: k.userID, IdempotencyKey: k.key, Body: body}
}

func checkSignedReplay(ctx context.Context, r *run) (string, error) {
	k, body, ctype, err := r.abandoned(ctx, "signed")
	if err != nil {
		return "", err
	}
	s, err := r.signer()
	if err != nil {
		return "", err
	}
	sig, err := s.Sign(r.replayRequest(k, body))
	if err != nil {
		return "", err
	}
	a, err := r.send(ctx, req{key: k.key, signature: sig, rawBody: body, rawType: ctype})
	if err != nil {
		return "", err
	}
	if !a.ok() {
		return "", failf("the completer's signed replay of an abandoned key answered %s: the API must accept it (the same secret as the completer's, the verifier mounted before its own authentication)", a)
	}
	after, err := r.db.byID(ctx, k.id)
	if err != nil {
		return "", err
	}
	if after.recoveryPoint != "finished" {
		return "", failf("the signed replay answered %s but left the key at %q", a, after.recoveryPoint)
	}
	return "", nil
}

// refused sends a replay made by forge for an abandoned key and fails
// unless it is answered 401 and neither the key nor staged_jobs change.
func (r *run) refused(ctx context.Context, scenario, what string, forge func(k keyRow, body []byte) (sig string, sent []byte, err error)) (string, error) {
	k, body, ctype, err := r.abandoned(ctx, scenario)
	if err != nil {
		return "", err
	}
	m0, err := r.db.jobMark(ctx)
	if err != nil {
		return "", err
	}
	sig, sent, err := forge(k, body)
	if err != nil {
		return "", err
	}
	a, err := r.send(ctx, req{key: k.key, signature: sig, rawBody: sent, rawType: ctype})
	if err != nil {
		return "", err
	}
	if a.status != http.StatusUnauthorized {
		return "", failf("%s answered %s, want 401", what, a)
	}
	if err := r.db.unchanged(ctx, k, what+" was refused"); err != nil {
		return "", err
	}
	if jobs, err := r.db.jobsSince(ctx, m0); err != nil {
		return "", err
	} else if len(jobs) > 0 {
		return "", failf("%s was refused, yet %d job(s) were staged", what, len(jobs))
	}
	return "", nil
}

func checkForged(ctx context.Context, r *run) (string, error) {
	return r.refused(ctx, "forged", "a replay signed with another secret", func(k keyRow, body []byte) (string, []byte, error) {
		other, err := replayauth.NewSecret([]byte(randomHex(32)))
		if err != nil {
			return "", nil, err
		}
		s, err := replayauth.NewSigner(other)
		if err != nil {
			return "", nil, err
		}
		sig, err := s.Sign(r.replayRequest(k, body))
		return sig, body, err
	})
}

func checkTampered(ctx context.Context, r *run) (string, error) {
	return r.refused(ctx, "tampered", "a signed replay with its body changed after signing", func(k keyRow, body []byte) (string, []byte, error) {
		s, err := r.signer()
		if err != nil {
			return "", nil, err
		}
		sig, err := s.Sign(r.replayRequest(k, body))
		if err != nil {
			return "", nil, err
		}
		other, _, err := r.encode(r.cfg.Template.AltBody)
		return sig, other, err
	})
}

// expiredAge is how old the expired signature is: past the default
// skew window (5 minutes) and any sensible other.
const expiredAge = time.Hour

func checkExpired(ctx context.Context, r *run) (string, error) {
	return r.refused(ctx, "expired", "a replay signed an hour ago", func(k keyRow, body []byte) (string, []byte, error) {
		s, err := r.signer()
		if err != nil {
			return "", nil, err
		}
		sig, err := s.WithClock(func() time.Time { return time.Now().Add(-expiredAge) }).Sign(r.replayRequest(k, body))
		return sig, body, err
	})
}

func checkForeignUser(ctx context.Context, r *run) (string, error) {
	return r.refused(ctx, "foreign", "a replay signed for a user who does not own the key", func(k keyRow, body []byte) (string, []byte, error) {
		s, err := r.signer()
		if err != nil {
			return "", nil, err
		}
		req := r.replayRequest(k, body)
		req.UserID = k.userID + 1
		sig, err := s.Sign(req)
		return sig, body, err
	})
}

func checkNonce(ctx context.Context, r *run) (string, error) {
	seed, err := r.seedRow(ctx)
	if err != nil {
		return "", err
	}
	// A key another request holds: the signature is accepted (its nonce
	// spent) and the API answers 409, so the key stays unfinished and the
	// second send meets the nonce check alone.
	k, err := r.db.clone(ctx, seed, r.key("nonce"), lockedNow)
	if err != nil {
		return "", err
	}
	body, ctype, err := r.encode([]byte(k.params))
	if err != nil {
		return "", fmt.Errorf("encode the stored params: %w", err)
	}
	s, err := r.signer()
	if err != nil {
		return "", err
	}
	sig, err := s.Sign(r.replayRequest(k, body))
	if err != nil {
		return "", err
	}
	q := req{key: k.key, signature: sig, rawBody: body, rawType: ctype}
	a1, err := r.send(ctx, q)
	if err != nil {
		return "", err
	}
	if a1.status == http.StatusUnauthorized {
		return "", failf("a valid signature for a key another request holds answered %s, want it accepted (and then 409); the nonce check cannot be tested", a1)
	}
	if after, err := r.db.byID(ctx, k.id); err != nil {
		return "", err
	} else if after.recoveryPoint == "finished" {
		return "", failf("a valid signature for a key another request holds answered %s and finished the key; the nonce check cannot be tested", a1)
	}
	a2, err := r.send(ctx, q)
	if err != nil {
		return "", err
	}
	if a2.status != http.StatusUnauthorized {
		return "", failf("the same signature sent a second time answered %s (the first %s), want 401: a nonce is accepted once", a2, a1)
	}
	return "", nil
}

func deref[T any](p *T) any {
	if p == nil {
		return nil
	}
	return *p
}

// jsonEqual reports whether a and b are the same JSON value (a JSONB
// response_body is stored re-spaced).
func jsonEqual(a, b string) bool {
	var x, y any
	if json.Unmarshal([]byte(a), &x) != nil || json.Unmarshal([]byte(b), &y) != nil {
		return false
	}
	return reflect.DeepEqual(x, y)
}
