package console_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"
)

// This file drives Debian's headless Chromium through chromedriver
// (package chromium-driver) with the W3C WebDriver protocol, plain JSON
// over HTTP, so the browser test can act on the console as a person does:
// type a note into a form and press its button. No websocket, no module.

// chromedriver finds Debian's chromedriver: with CI=true a missing driver
// fails the test (scripts/ensure-chromium.sh installs it), elsewhere it
// skips, as chromium does.
func chromedriver(t *testing.T) string {
	t.Helper()
	if p, err := exec.LookPath("chromedriver"); err == nil {
		return p
	}
	if os.Getenv("CI") == "true" {
		t.Fatal("chromedriver is not installed: run scripts/ensure-chromium.sh (CI must run the browser test)")
	}
	t.Skip("chromedriver is not installed: run scripts/ensure-chromium.sh to run the browser test")
	return ""
}

// webdriver is one WebDriver session of a chromedriver the test started.
type webdriver struct {
	t       *testing.T
	base    string // http://127.0.0.1:port
	session string
	client  *http.Client
}

// w3cElement is the key of an element reference in WebDriver's JSON.
const w3cElement = "element-6066-11e4-a52e-4f735466cecf"

// startWebDriver starts chromedriver on a free loopback port and opens a
// session of headless Chromium (browser); both end with the test.
func startWebDriver(t *testing.T, driver, browser string) *webdriver {
	t.Helper()
	// The browser's profile directory is made before the cleanup below is
	// registered, so that it is removed after the session has ended and
	// the browser quit (cleanups run last registered first): removed
	// first, it raced with a browser still writing into it.
	profile := t.TempDir()
	ctx, cancel := context.WithCancel(context.Background())
	var port int
	var cmd *exec.Cmd
	var logs bytes.Buffer
	for attempt := 0; ; attempt++ {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		port = ln.Addr().(*net.TCPAddr).Port
		ln.Close()
		logs.Reset()
		cmd = exec.CommandContext(ctx, driver, "--port="+strconv.Itoa(port))
		cmd.Stdout, cmd.Stderr = &logs, &logs
		cmd.WaitDelay = 5 * time.Second
		if err := cmd.Start(); err != nil {
			cancel()
			t.Fatalf("start chromedriver: %v", err)
		}
		if waitReady(port, 20*time.Second) {
			break
		}
		cancel()
		_ = cmd.Wait()
		if attempt == 2 {
			t.Fatalf("chromedriver did not become ready on port %d:\n%s", port, logs.String())
		}
		ctx, cancel = context.WithCancel(context.Background())
	}
	wd := &webdriver{t: t, base: fmt.Sprintf("http://127.0.0.1:%d", port), client: &http.Client{Timeout: 60 * time.Second}}
	t.Cleanup(func() {
		if wd.session != "" {
			_, _ = wd.call(http.MethodDelete, "/session/"+wd.session, nil)
		}
		cancel() // kills the chromedriver this test started (and so its browser)
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("chromedriver log:\n%s", logs.String())
		}
	})

	caps := map[string]any{"capabilities": map[string]any{"alwaysMatch": map[string]any{
		"browserName":      "chrome",
		"pageLoadStrategy": "normal",
		"goog:chromeOptions": map[string]any{
			"binary": browser,
			"args": []string{"--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
				"--disable-extensions", "--disable-background-networking", "--disable-sync", "--window-size=1280,1000",
				"--user-data-dir=" + profile},
		},
	}}}
	v, err := wd.call(http.MethodPost, "/session", caps)
	if err != nil {
		t.Fatalf("new WebDriver session: %v", err)
	}
	var s struct {
		SessionID string `json:"sessionId"`
	}
	if err := json.Unmarshal(v, &s); err != nil || s.SessionID == "" {
		t.Fatalf("new WebDriver session: %v: %s", err, v)
	}
	wd.session = s.SessionID
	// Finding an element waits up to this long for it to appear, so a find
	// after a click that loads a page waits for that page.
	wd.must(http.MethodPost, "/timeouts", map[string]any{"implicit": 10000, "pageLoad": 30000})
	return wd
}

func waitReady(port int, timeout time.Duration) bool {
	deadline := time.Now().Add(timeout)
	c := &http.Client{Timeout: time.Second}
	for time.Now().Before(deadline) {
		resp, err := c.Get(fmt.Sprintf("http://127.0.0.1:%d/status", port))
		if err == nil {
			var st struct {
				Value struct {
					Ready bool `json:"ready"`
				} `json:"value"`
			}
			err = json.NewDecoder(resp.Body).Decode(&st)
			resp.Body.Close()
			if err == nil && st.Value.Ready {
				return true
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	return false
}

// call sends one WebDriver command and returns its "value", or the
// WebDriver error it answered.
func (wd *webdriver) call(method, path string, body any) (json.RawMessage, error) {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return nil, err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, wd.base+path, rd)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := wd.client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	var out struct {
		Value json.RawMessage `json:"value"`
	}
	if err := json.Unmarshal(raw, &out); err != nil {
		return nil, fmt.Errorf("%s %s: %d %s", method, path, resp.StatusCode, raw)
	}
	if resp.StatusCode != http.StatusOK {
		var e struct {
			Error   string `json:"error"`
			Message string `json:"message"`
		}
		_ = json.Unmarshal(out.Value, &e)
		return nil, fmt.Errorf("%s %s: %d %s: %s", method, path, resp.StatusCode, e.Error, e.Message)
	}
	return out.Value, nil
}

// must runs a command of the session and fails the test on an error.
func (wd *webdriver) must(method, path string, body any) json.RawMessage {
	wd.t.Helper()
	v, err := wd.call(method, "/session/"+wd.session+path, body)
	if err != nil {
		wd.t.Fatal(err)
	}
	return v
}

// open navigates to url and waits for the page to load.
func (wd *webdriver) open(url string) {
	wd.t.Helper()
	wd.must(http.MethodPost, "/url", map[string]any{"url": url})
}

// find returns the element css selects, waiting for it to appear.
func (wd *webdriver) find(css string) string {
	wd.t.Helper()
	v, err := wd.call(http.MethodPost, "/session/"+wd.session+"/element", map[string]any{"using": "css selector", "value": css})
	if err != nil {
		wd.t.Fatalf("find %s on %s: %v\n%s", css, wd.url(), err, wd.source())
	}
	var el map[string]string
	if err := json.Unmarshal(v, &el); err != nil || el[w3cElement] == "" {
		wd.t.Fatalf("find %s: %v: %s", css, err, v)
	}
	return el[w3cElement]
}

// onElement runs the element command path (after /element/{id}) on the
// element css selects. An element found on the page a click is leaving
// goes stale before the command reaches it: it is found again on the new
// page, until the deadline.
func (wd *webdriver) onElement(method, css, path string, body any) json.RawMessage {
	wd.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		v, err := wd.call(method, "/session/"+wd.session+"/element/"+wd.find(css)+path, body)
		if err == nil {
			return v
		}
		if !strings.Contains(err.Error(), "stale element reference") || time.Now().After(deadline) {
			wd.t.Fatalf("%s on %s: %v", path, css, err)
		}
	}
}

// typeInto types text into the element css selects, as a keyboard would.
func (wd *webdriver) typeInto(css, text string) {
	wd.t.Helper()
	wd.onElement(http.MethodPost, css, "/value", map[string]any{"text": text})
}

// click clicks the element css selects; a submit button's page load is
// waited for.
func (wd *webdriver) click(css string) {
	wd.t.Helper()
	wd.onElement(http.MethodPost, css, "/click", map[string]any{})
}

// text is the rendered text of the element css selects.
func (wd *webdriver) text(css string) string {
	wd.t.Helper()
	var s string
	if err := json.Unmarshal(wd.onElement(http.MethodGet, css, "/text", nil), &s); err != nil {
		wd.t.Fatal(err)
	}
	return s
}

// textContaining is the rendered text of the element css selects once it
// contains want, or, at the deadline, as it is then. A click's page load
// is not always over when the click returns: the element found may still
// be the page's before it.
func (wd *webdriver) textContaining(css, want string) string {
	wd.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		got := wd.text(css)
		if strings.Contains(got, want) || time.Now().After(deadline) {
			return got
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// script runs JavaScript in the page (WebDriver's execute/sync).
func (wd *webdriver) script(js string, args ...any) {
	wd.t.Helper()
	if args == nil {
		args = []any{}
	}
	wd.must(http.MethodPost, "/execute/sync", map[string]any{"script": js, "args": args})
}

func (wd *webdriver) url() string {
	v, err := wd.call(http.MethodGet, "/session/"+wd.session+"/url", nil)
	if err != nil {
		return "(" + err.Error() + ")"
	}
	var s string
	_ = json.Unmarshal(v, &s)
	return s
}

func (wd *webdriver) source() string {
	v, err := wd.call(http.MethodGet, "/session/"+wd.session+"/source", nil)
	if err != nil {
		return "(" + err.Error() + ")"
	}
	var s string
	_ = json.Unmarshal(v, &s)
	return s
}

// TestBrowserActs acts on the console in headless Chromium as an operator
// does, through the pages' own forms (each with the CSRF token the page
// rendered): on the review queue it hands the given-up key back to the
// completer and resolves the other key's review; on the dead letter's page
// it requeues it. SQL then checks each happened and was recorded under the
// console's operator identity (carol, via console). A form whose token was
// tampered with in the page is refused and changes nothing.
//
// Not parallel: two Chromiums at once on two cores left one's profile
// being written while its test removed it (TempDir cleanup failed).
func TestBrowserActs(t *testing.T) {
	browser := chromium(t)
	driver := chromedriver(t)
	s := seed(t)
	ts := serve(t, s, options{operator: "carol"})
	wd := startWebDriver(t, driver, browser)
	key, rev, otherRev := strconv.FormatInt(s.gaveUp, 10), strconv.FormatInt(s.review, 10), strconv.FormatInt(s.otherRev, 10)

	// The review queue: both open reviews, acting as carol.
	wd.open(ts.URL + "/reviews")
	if got := wd.text("#identity"); got != "acting as carol" {
		t.Fatalf("identity on the review queue: %q", got)
	}
	wd.find("#review-" + rev)
	wd.find("#review-" + otherRev)

	// A tampered token: the page's form, its csrf input changed in the
	// page before the click. Refused (403), nothing changes.
	wd.typeInto(`#review-`+otherRev+` form[action="/reviews/`+otherRev+`/resolve"] input[name="note"]`, "forged")
	wd.script(`document.querySelector('#review-` + otherRev + ` form[action="/reviews/` + otherRev + `/resolve"] input[name="csrf"]').value = 'forged-token';`)
	wd.click("#resolve-" + otherRev)
	if got := wd.textContaining("#error", "CSRF token"); !strings.Contains(got, "CSRF token") {
		t.Fatalf("tampered token: error %q", got)
	}
	if n := count(t, s.pool, "SELECT count(*) FROM idempotency_key_reviews WHERE id = $1 AND resolved_at IS NULL", s.otherRev); n != 1 {
		t.Fatal("a form with a tampered token resolved the review")
	}

	// Retry the given-up key from its review.
	wd.open(ts.URL + "/reviews")
	retryNote := "API fix v2.3.1 deployed (browser)"
	wd.typeInto(`#review-`+rev+` form[action="/keys/`+key+`/retry"] input[name="note"]`, retryNote)
	wd.click("#retry-" + key)
	if got := wd.textContaining("#message", "key "+key+" handed back to the completer by carol"); !strings.Contains(got, "key "+key+" handed back to the completer by carol") {
		t.Fatalf("after retry: message %q on %s", got, wd.url())
	}
	if !strings.HasSuffix(strings.SplitN(wd.url(), "?", 2)[0], "/reviews") {
		t.Errorf("after retry: at %s, want back on /reviews", wd.url())
	}

	// Resolve the other review with the page's own form.
	resolveNote := "refunded the rider by hand (browser)"
	wd.typeInto(`#review-`+otherRev+` form[action="/reviews/`+otherRev+`/resolve"] input[name="note"]`, resolveNote)
	wd.click("#resolve-" + otherRev)
	if got := wd.textContaining("#message", "review "+otherRev+" resolved by carol"); !strings.Contains(got, "review "+otherRev+" resolved by carol") {
		t.Fatalf("after resolve: message %q on %s", got, wd.url())
	}
	if got := wd.text("#no-reviews"); got != "no open reviews" {
		t.Errorf("review queue after both actions: %q", got)
	}

	// Requeue the dead letter from its page.
	dead := strconv.FormatInt(s.dead, 10)
	wd.open(ts.URL + "/dead/" + dead)
	requeueNote := "send_ride_receipt_v2 worker deployed (browser)"
	wd.typeInto(`form[action="/dead/`+dead+`/requeue"] input[name="note"]`, requeueNote)
	wd.click("#requeue")
	if got := wd.textContaining("#message", "carol"); !strings.Contains(got, "carol") {
		t.Fatalf("after requeue: message %q on %s", got, wd.url())
	}
	if got := wd.textContaining("#dead-where", "staged again"); !strings.Contains(got, "staged again") {
		t.Errorf("dead page after requeue: %q", got)
	}

	// SQL oracles: each action happened, and was recorded as carol's.
	oracles := []struct {
		what string
		sql  string
		args []any
	}{
		{"the key is handed back (completer columns reset, tracked again)", `SELECT count(*) FROM idempotency_keys k
JOIN idemd_unfinished_keys u ON u.key_id = k.id AND u.created_at = k.created_at
WHERE k.id = $1 AND k.completer_gave_up_at IS NULL AND k.completer_attempts = 0`, []any{s.gaveUp}},
		{"the retry is audited as carol via the console", `SELECT count(*) FROM idemd_operator_actions
WHERE action = 'key_retry' AND actor = 'carol' AND via = 'console' AND key_id = $1 AND review_id = $2 AND note = $3`, []any{s.gaveUp, s.review, retryNote}},
		{"the retried key's review is resolved by carol", `SELECT count(*) FROM idempotency_key_reviews
WHERE id = $1 AND resolved_at IS NOT NULL AND resolved_by = 'carol' AND resolution_note LIKE '%' || $2`, []any{s.review, retryNote}},
		{"the other review is resolved by carol with the typed note", `SELECT count(*) FROM idempotency_key_reviews
WHERE id = $1 AND resolved_at IS NOT NULL AND resolved_by = 'carol' AND resolution_note = $2`, []any{s.otherRev, resolveNote}},
		{"the dead letter is staged again under its id", `SELECT count(*) FROM staged_jobs s
WHERE s.id = $1 AND s.job_name = 'send_ride_receipt_v2' AND NOT EXISTS (SELECT FROM staged_jobs_dead d WHERE d.id = $1)`, []any{s.dead}},
		{"the requeue is audited as carol via the console", `SELECT count(*) FROM idemd_operator_actions
WHERE action = 'dead_requeue' AND actor = 'carol' AND via = 'console' AND staged_job_id = $1 AND note = $2`, []any{s.dead, requeueNote}},
		{"two actions recorded, both carol's via the console (the refused form none)", `SELECT (count(*) = 2 AND bool_and(actor = 'carol' AND via = 'console'))::int
FROM idemd_operator_actions`, nil},
	}
	for _, o := range oracles {
		if n := count(t, s.pool, o.sql, o.args...); n != 1 {
			t.Errorf("%s: %d rows, want 1", o.what, n)
		}
	}
}
