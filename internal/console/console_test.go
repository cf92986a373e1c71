package console_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/zap"

	"github.com/idemd/idemd/internal/console"
	"github.com/idemd/idemd/internal/logging"
	"github.com/idemd/idemd/internal/reaper"
	"github.com/idemd/idemd/internal/review"
	"github.com/idemd/idemd/internal/testing/dbtest"
)

func TestMain(m *testing.M) { dbtest.Main(m) }

// seeded is what seed put in the database.
type seeded struct {
	pool     *pgxpool.Pool
	gaveUp   int64 // a key the completer gave up on, with an open review
	review   int64 // its review
	finished int64 // a finished key
	other    int64 // an unfinished key with an open review of its own
	otherRev int64
	dead     int64 // a dead letter
}

func execSQL(t *testing.T, pool *pgxpool.Pool, sql string, args ...any) {
	t.Helper()
	if _, err := pool.Exec(context.Background(), sql, args...); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

func count(t *testing.T, pool *pgxpool.Pool, sql string, args ...any) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return n
}

func addKey(t *testing.T, pool *pgxpool.Pool, name, rp, age string) int64 {
	t.Helper()
	var id int64
	err := pool.QueryRow(context.Background(), `
INSERT INTO idempotency_keys (created_at, idempotency_key, request_method, request_params, request_path, recovery_point, user_id, locked_at)
VALUES (now() - $3::interval, $1, 'POST', '{"origin_lat": 0.0, "target_lon": 1.5}', '/rides', $2, 42, NULL) RETURNING id`, name, rp, age).Scan(&id)
	if err != nil {
		t.Fatal(err)
	}
	return id
}

func flag(t *testing.T, pool *pgxpool.Pool, key int64, reason string) int64 {
	t.Helper()
	ctx := context.Background()
	if _, err := review.Flag(ctx, pool, key, reason, "completer gave up: 20 failed attempts", "completer"); err != nil {
		t.Fatal(err)
	}
	var id int64
	if err := pool.QueryRow(ctx, "SELECT id FROM idempotency_key_reviews WHERE key_id = $1 AND reason = $2", key, reason).Scan(&id); err != nil {
		t.Fatal(err)
	}
	return id
}

func seed(t *testing.T) *seeded {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), dbtest.NewDatabase(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	s := &seeded{pool: pool}
	s.gaveUp = addKey(t, pool, "ride-gave-up-7f3a", "ride_created", "3 hours")
	execSQL(t, pool, `UPDATE idempotency_keys SET completer_gave_up_at = now(), completer_attempts = 20,
completer_last_error = 'API answered 503 Service Unavailable' WHERE id = $1`, s.gaveUp)
	execSQL(t, pool, "DELETE FROM idemd_unfinished_keys WHERE key_id = $1", s.gaveUp)
	s.review = flag(t, pool, s.gaveUp, review.ReasonCompleterGaveUp)
	s.finished = addKey(t, pool, "ride-finished-1", "finished", "1 hour")
	s.other = addKey(t, pool, "ride-started-2", "started", "2 hours")
	execSQL(t, pool, "UPDATE idempotency_keys SET completer_gave_up_at = now(), completer_attempts = 3 WHERE id = $1", s.other)
	s.otherRev = flag(t, pool, s.other, review.ReasonCompleterGaveUp)
	addKey(t, pool, "ride-unfinished-3", "started", "10 minutes")
	execSQL(t, pool, `INSERT INTO staged_jobs (job_name, job_args, created_at) VALUES ('send_ride_receipt', '{"ride_id": 1}', now() - interval '90 seconds'),
('send_ride_receipt', '{"ride_id": 2}', now())`)
	s.dead = 880001
	execSQL(t, pool, `INSERT INTO staged_jobs_dead (id, created_at, job_name, job_args, queue, reason, dead_at)
VALUES ($1, now() - interval '1 hour', 'send_ride_receipt_v2', '{"ride_id": 3}', 'receipts', 'unknown_kind: send_ride_receipt_v2 is not registered', now() - interval '1 hour')`, s.dead)
	execSQL(t, pool, `INSERT INTO idemd_reaper_runs (started_at, finished_at, mode, result, deleted, flagged, error, holder, throttled_seconds, throttle_reason, stop_reason) VALUES
    (now() - interval '2 hours 10 seconds', now() - interval '2 hours 10 seconds' + interval '4 seconds', 'once', 'complete', 30, 10, NULL, 'reaper/pod-a/1/aa', 1.25, 'replica_lag', NULL),
    (now() - interval '1 hour', now() - interval '1 hour' + interval '1 second', 'once', 'error', 0, 0, 'reaper: the --max-deletes cap', 'reaper/pod-b/1/bb', 0, NULL, 'error')`)
	execSQL(t, pool, `INSERT INTO river_job (args, kind, max_attempts, metadata, priority, queue, state, scheduled_at)
VALUES ('{"ride_id": 9}', 'send_ride_receipt', 25, $1, 1, 'default', 'available', now())`, `{"idemd_key_id": `+strconv.FormatInt(s.gaveUp, 10)+`, "idemd_staged_id": 12}`)
	return s
}

type options struct {
	operator, header string
	readOnly, river  bool
}

// serve starts the console on s's database.
func serve(t *testing.T, s *seeded, o options) *httptest.Server {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	cfg := console.Config{
		Pool: s.pool, Eligibility: reaper.Eligibility{Retention: 72 * time.Hour, LockWindow: time.Hour},
		Operator: o.operator, OperatorHeader: o.header, ReadOnly: o.readOnly, GiveUpAfter: 23 * time.Hour, Logger: zap.NewNop(),
	}
	if o.river {
		h, err := console.NewRiverUI(ctx, s.pool, logging.Slog(zap.NewNop()))
		if err != nil {
			t.Fatal(err)
		}
		cfg.River = h
	}
	srv, err := console.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(srv)
	t.Cleanup(ts.Close)
	return ts
}

var noRedirect = &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}

func get(t *testing.T, ts *httptest.Server, path string, header ...string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, ts.URL+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := noRedirect.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func post(t *testing.T, ts *httptest.Server, path string, form url.Values, header ...string) (int, string, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, ts.URL+path, strings.NewReader(form.Encode()))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := noRedirect.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header.Get("Location"), string(b)
}

var csrfRE = regexp.MustCompile(`name="csrf" value="([^"]+)"`)

func csrf(t *testing.T, page string) string {
	t.Helper()
	m := csrfRE.FindStringSubmatch(page)
	if m == nil {
		t.Fatalf("no CSRF token on the page:\n%s", page)
	}
	return m[1]
}

func mustContain(t *testing.T, what, page string, wants ...string) {
	t.Helper()
	for _, w := range wants {
		if !strings.Contains(page, w) {
			t.Errorf("%s lacks %q", what, w)
		}
	}
	if t.Failed() {
		t.Fatalf("%s:\n%s", what, page)
	}
}

// TestPagesRender: every page renders the seeded data.
func TestPagesRender(t *testing.T) {
	t.Parallel()
	s := seed(t)
	ts := serve(t, s, options{operator: "carol", river: true})
	id := func(i int64) string { return strconv.FormatInt(i, 10) }

	pages := []struct {
		path  string
		wants []string
	}{
		{"/", []string{`id="staged-jobs">2<`, "oldest 1m3", `<a href="/dead">1</a>`, `<td>started</td><td>1</td>`,
			"completer_gave_up", "acting as <strong>carol</strong>", "River jobs available",
			`id="last-reaper-success">2h0m ago<`, `<td>once</td><td>complete</td><td>2h0m ago</td><td>4s</td><td>30</td><td>10</td><td>1.2s replica_lag</td><td>-</td>`,
			`<td>0</td><td>0</td><td>-</td><td>error</td>`,
			`<td>error</td>`, "the --max-deletes cap"}},
		{"/reviews", []string{"review " + id(s.review), "ride-gave-up-7f3a", "completer gave up: 20 failed attempts",
			"API answered 503", `action="/reviews/` + id(s.review) + `/resolve"`, `action="/keys/` + id(s.gaveUp) + `/retry"`}},
		{"/reviews?state=all", []string{"review " + id(s.review), "review " + id(s.otherRev)}},
		{"/keys", []string{"Key lookup", `name="user_id"`}},
		{"/keys/" + id(s.gaveUp), []string{`id="key-state">gave_up<`, `id="key-recovery-point">ride_created<`, "POST /rides",
			`&#34;target_lon&#34;: 1.5`, "API answered 503", `id="key-attempts">20<`, "send_ride_receipt", "staged id 12",
			`action="/keys/` + id(s.gaveUp) + `/retry"`, `action="/reviews/` + id(s.review) + `/resolve"`}},
		{"/keys?user_id=42&key=ride-finished-1", []string{`id="key-state">finished<`, "retry not possible: the key is finished"}},
		{"/dead", []string{id(s.dead), "send_ride_receipt_v2", "unknown_kind", `action="/dead/` + id(s.dead) + `/requeue"`}},
		{"/dead/" + id(s.dead), []string{"dead-lettered", `id="dead-reason">unknown_kind`, "&#34;ride_id&#34;: 3", "receipts"}},
		{"/static/console.css", []string{"font:"}},
		{"/river/", []string{"<html", "/river/"}},
		{"/river/api/jobs?state=available", []string{`"kind":"send_ride_receipt"`}},
	}
	for _, p := range pages {
		code, body := get(t, ts, p.path)
		if code != http.StatusOK {
			t.Fatalf("GET %s: %d\n%s", p.path, code, body)
		}
		mustContain(t, "GET "+p.path, body, p.wants...)
	}
	for path, want := range map[string]int{
		"/keys/99999999":      http.StatusNotFound,
		"/dead/99999999":      http.StatusNotFound,
		"/keys/abc":           http.StatusBadRequest,
		"/reviews?state=nope": http.StatusBadRequest,
		"/keys?user_id=42":    http.StatusBadRequest,
		"/nope":               http.StatusNotFound,
	} {
		if code, body := get(t, ts, path); code != want {
			t.Errorf("GET %s: %d, want %d\n%s", path, code, want, body)
		}
	}
}

// TestActions: retry, requeue and resolve from the console's forms change
// the database and are recorded under the console's operator; a POST
// without the CSRF token, or from another origin, changes nothing.
func TestActions(t *testing.T) {
	t.Parallel()
	s := seed(t)
	ts := serve(t, s, options{operator: "carol", river: true})
	id := func(i int64) string { return strconv.FormatInt(i, 10) }
	_, page := get(t, ts, "/keys/"+id(s.gaveUp))
	token := csrf(t, page)

	// Refused: no token, a wrong token, no note, a cross-site browser request.
	for name, c := range map[string]struct {
		form   url.Values
		header []string
		want   int
	}{
		"no token":    {url.Values{"note": {"fixed"}}, nil, http.StatusForbidden},
		"wrong token": {url.Values{"note": {"fixed"}, "csrf": {token + "x"}}, nil, http.StatusForbidden},
		"no note":     {url.Values{"csrf": {token}}, nil, http.StatusBadRequest},
		"cross-site":  {url.Values{"note": {"fixed"}, "csrf": {token}}, []string{"Sec-Fetch-Site", "cross-site", "Origin", "https://evil.example"}, http.StatusForbidden},
	} {
		code, _, body := post(t, ts, "/keys/"+id(s.gaveUp)+"/retry", c.form, c.header...)
		if code != c.want {
			t.Errorf("%s: %d, want %d\n%s", name, code, c.want, body)
		}
	}
	if code, _, _ := post(t, ts, "/dead/"+id(s.dead)+"/requeue", url.Values{"note": {"x"}}); code != http.StatusForbidden {
		t.Errorf("requeue without token: %d", code)
	}
	if code, _, _ := post(t, ts, "/reviews/"+id(s.otherRev)+"/resolve", url.Values{"note": {"x"}}); code != http.StatusForbidden {
		t.Errorf("resolve without token: %d", code)
	}
	if n := count(t, s.pool, "SELECT count(*) FROM idemd_operator_actions"); n != 0 {
		t.Fatalf("refused posts recorded %d actions", n)
	}
	if n := count(t, s.pool, "SELECT count(*) FROM idempotency_key_reviews WHERE resolved_at IS NOT NULL"); n != 0 {
		t.Fatalf("refused posts resolved %d reviews", n)
	}
	if n := count(t, s.pool, "SELECT count(*) FROM idempotency_keys WHERE id = $1 AND completer_gave_up_at IS NOT NULL", s.gaveUp); n != 1 {
		t.Fatal("refused post changed the key")
	}

	// Retry.
	code, loc, body := post(t, ts, "/keys/"+id(s.gaveUp)+"/retry", url.Values{"note": {"API fix deployed"}, "csrf": {token}})
	if code != http.StatusSeeOther || !strings.HasPrefix(loc, "/keys/"+id(s.gaveUp)+"?msg=") {
		t.Fatalf("retry: %d %s\n%s", code, loc, body)
	}
	if n := count(t, s.pool, `SELECT count(*) FROM idempotency_keys WHERE id = $1 AND completer_gave_up_at IS NULL AND completer_attempts = 0`, s.gaveUp); n != 1 {
		t.Fatal("retry did not reset the key")
	}
	if n := count(t, s.pool, `SELECT count(*) FROM idemd_operator_actions WHERE action = 'key_retry' AND actor = 'carol' AND via = 'console' AND key_id = $1 AND review_id = $2 AND note = 'API fix deployed'`, s.gaveUp, s.review); n != 1 {
		t.Fatal("retry not recorded")
	}
	if n := count(t, s.pool, `SELECT count(*) FROM idempotency_key_reviews WHERE id = $1 AND resolved_by = 'carol'`, s.review); n != 1 {
		t.Fatal("retry did not resolve the review")
	}
	_, page = get(t, ts, loc)
	mustContain(t, "key page after retry", page, "handed back to the completer by carol", `id="key-state">unfinished<`, "key_retry", "API fix deployed")

	// Requeue, then again: the second finds nothing.
	code, loc, body = post(t, ts, "/dead/"+id(s.dead)+"/requeue", url.Values{"note": {"v2 worker deployed"}, "csrf": {token}, "return": {"/dead"}})
	if code != http.StatusSeeOther || !strings.HasPrefix(loc, "/dead?msg=") {
		t.Fatalf("requeue: %d %s\n%s", code, loc, body)
	}
	if n := count(t, s.pool, "SELECT count(*) FROM staged_jobs WHERE id = $1 AND job_name = 'send_ride_receipt_v2'", s.dead); n != 1 {
		t.Fatal("requeue did not stage the job")
	}
	if code, _, _ := post(t, ts, "/dead/"+id(s.dead)+"/requeue", url.Values{"note": {"again"}, "csrf": {token}}); code != http.StatusNotFound {
		t.Fatalf("second requeue: %d", code)
	}
	if n := count(t, s.pool, "SELECT count(*) FROM staged_jobs WHERE id = $1", s.dead); n != 1 {
		t.Fatal("second requeue staged the job twice")
	}
	if n := count(t, s.pool, `SELECT count(*) FROM idemd_operator_actions WHERE action = 'dead_requeue' AND actor = 'carol' AND staged_job_id = $1`, s.dead); n != 1 {
		t.Fatal("requeue not recorded once")
	}
	_, page = get(t, ts, "/dead/"+id(s.dead))
	mustContain(t, "dead page after requeue", page, "staged again", "dead_requeue", "v2 worker deployed")

	// Resolve, then again: the note is never overwritten.
	code, loc, body = post(t, ts, "/reviews/"+id(s.otherRev)+"/resolve", url.Values{"note": {"refunded by hand"}, "csrf": {token}, "return": {"/reviews"}})
	if code != http.StatusSeeOther || !strings.HasPrefix(loc, "/reviews?msg=") {
		t.Fatalf("resolve: %d %s\n%s", code, loc, body)
	}
	if n := count(t, s.pool, `SELECT count(*) FROM idempotency_key_reviews WHERE id = $1 AND resolved_by = 'carol' AND resolution_note = 'refunded by hand'`, s.otherRev); n != 1 {
		t.Fatal("resolve not recorded")
	}
	code, _, body = post(t, ts, "/reviews/"+id(s.otherRev)+"/resolve", url.Values{"note": {"again"}, "csrf": {token}})
	if code != http.StatusConflict || !strings.Contains(body, "already resolved by carol") {
		t.Fatalf("second resolve: %d\n%s", code, body)
	}
	_, page = get(t, ts, "/")
	mustContain(t, "status after actions", page, "key_retry", "dead_requeue", "carol")

	// River's own job actions are off by default.
	if code, _, _ := post(t, ts, "/river/api/jobs/cancel", url.Values{}); code != http.StatusForbidden {
		t.Fatalf("riverui action: %d", code)
	}
	// A redirect target off the site is ignored.
	_, page = get(t, ts, "/keys/"+id(s.other))
	code, loc, _ = post(t, ts, "/keys/"+id(s.other)+"/retry", url.Values{"note": {"x"}, "csrf": {csrf(t, page)}, "return": {"//evil.example/"}})
	if code != http.StatusSeeOther || !strings.HasPrefix(loc, "/keys/") {
		t.Fatalf("open redirect: %d %s", code, loc)
	}
}

// TestIdentity: without an identity the console is read-only; behind a
// proxy the header names who acts, a request without it is refused, and a
// token is good only for its own identity.
func TestIdentity(t *testing.T) {
	t.Parallel()
	s := seed(t)
	id := strconv.FormatInt(s.gaveUp, 10)

	anon := serve(t, s, options{})
	code, page := get(t, anon, "/keys/"+id)
	if code != http.StatusOK || strings.Contains(page, `name="csrf"`) || !strings.Contains(page, "read-only: no operator identity") {
		t.Fatalf("anonymous page: %d\n%s", code, page)
	}
	if code, _, _ := post(t, anon, "/keys/"+id+"/retry", url.Values{"note": {"x"}, "csrf": {"anything"}}); code != http.StatusForbidden {
		t.Fatalf("anonymous retry: %d", code)
	}

	ro := serve(t, s, options{operator: "carol", readOnly: true})
	if _, page := get(t, ro, "/reviews"); strings.Contains(page, `name="csrf"`) || !strings.Contains(page, "read-only console") {
		t.Fatalf("read-only page offers actions:\n%s", page)
	}

	proxied := serve(t, s, options{header: "X-Forwarded-Email", river: true})
	if code, _ := get(t, proxied, "/"); code != http.StatusUnauthorized {
		t.Fatalf("no header: %d", code)
	}
	if code, _ := get(t, proxied, "/river/"); code != http.StatusUnauthorized {
		t.Fatalf("no header, river: %d", code)
	}
	_, page = get(t, proxied, "/keys/"+id, "X-Forwarded-Email", "dana@example.com")
	mustContain(t, "proxied page", page, "acting as <strong>dana@example.com</strong>")
	token := csrf(t, page)
	if code, _, _ := post(t, proxied, "/keys/"+id+"/retry", url.Values{"note": {"x"}, "csrf": {token}}, "X-Forwarded-Email", "eve@example.com"); code != http.StatusForbidden {
		t.Fatalf("another identity's token: %d", code)
	}
	if code, _, body := post(t, proxied, "/keys/"+id+"/retry", url.Values{"note": {"fixed upstream"}, "csrf": {token}}, "X-Forwarded-Email", "dana@example.com"); code != http.StatusSeeOther {
		t.Fatalf("proxied retry: %d\n%s", code, body)
	}
	if n := count(t, s.pool, "SELECT count(*) FROM idemd_operator_actions WHERE actor = 'dana@example.com' AND key_id = $1", s.gaveUp); n != 1 {
		t.Fatal("proxied retry not recorded under the header's identity")
	}
	if n := count(t, s.pool, "SELECT count(*) FROM idemd_operator_actions"); n != 1 {
		t.Fatal("refused posts recorded actions")
	}
}

// TestStatusPageCountsByTheRecordedRetention: the status page counts keys
// past retention by the retention and lock window the newest reaper run
// recorded, and says so; with none recorded, by the console's own flags,
// saying that instead.
func TestStatusPageCountsByTheRecordedRetention(t *testing.T) {
	t.Parallel()
	s := seed(t)
	ts := serve(t, s, options{operator: "carol"})
	pastRetention := regexp.MustCompile(`id="past-retention">(\d+)<`)
	count := func(body string) int {
		t.Helper()
		m := pastRetention.FindStringSubmatch(body)
		if m == nil {
			t.Fatalf("no keys past retention on the page\n%s", body)
		}
		n, err := strconv.Atoi(m[1])
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	_, body := get(t, ts, "/")
	mustContain(t, "GET / with no run's settings", body, `<h2>Reaper (retention 72h0m0s)</h2>`,
		"no reaper run recorded its retention and lock window", "counted with the console's --retention and --lock-window")
	byFlags := count(body)

	var run int64
	if err := s.pool.QueryRow(context.Background(), `INSERT INTO idemd_reaper_runs (started_at, finished_at, mode, result, deleted, flagged, holder, retention, lock_window)
VALUES (now() - interval '5 minutes', now() - interval '4 minutes', 'schedule', 'complete', 0, 0, 'reaper/pod-c/1/cc', interval '30 minutes', interval '5 minutes')
RETURNING id`).Scan(&run); err != nil {
		t.Fatal(err)
	}
	_, body = get(t, ts, "/")
	mustContain(t, "GET / after a run recorded its settings", body, `<h2>Reaper (retention 30m0s)</h2>`,
		fmt.Sprintf("retention 30m0s, lock window 5m0s: as reaper run %d recorded", run))
	if strings.Contains(body, "no reaper run recorded") {
		t.Errorf("the page still says no run recorded its settings\n%s", body)
	}
	if n := count(body); n <= byFlags {
		t.Errorf("%d keys past the recorded 30m retention, want more than the %d past the flags' 72h (keys of 1h and 2h are seeded)", n, byFlags)
	}
}
