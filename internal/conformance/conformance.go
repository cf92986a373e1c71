// Package conformance checks a running API against the idempotency-key
// protocol of docs/api-authors.md from outside, as a client, the database
// and the completer see it: `idemctl conformance`. Every scenario is a
// named claim with the section of the docs that makes it, and fails with
// what the API did instead.
//
// Scenarios run one after another, each on keys of its own
// (idemctl-conformance-<run>-<scenario>), so the staged-jobs oracle can
// attribute the jobs that appear to the request just sent. With a
// database, the checks read idemd's tables; the scenarios that need an
// abandoned or an in-progress key make one by copying a key the API itself
// wrote (its user, method, path, canonical params and fingerprint) under a
// fresh key value: the state a client leaves behind when it goes away
// after the key was claimed, which is generic across languages because
// every API stores its requests the same way (docs/languages/).
package conformance

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemd/idemd/idem/replayauth"
)

// Template is the request an API team describes in --request: one
// request of theirs that succeeds for a test user, in JSON.
type Template struct {
	Method  string            `json:"method"`
	Path    string            `json:"path"`
	Headers map[string]string `json:"headers"`
	// Body is a JSON object: sent as JSON, or form-encoded (Stripe-style
	// a[b]=c, as the completer's --request-encoding form) when Encoding
	// is "form".
	Body     json.RawMessage `json:"body"`
	Encoding string          `json:"encoding,omitempty"`
	// AltBody is a body with different parameters for the same endpoint
	// (the params-mismatch scenario); when empty, the first number of
	// Body is changed, else its first string.
	AltBody    json.RawMessage `json:"alt_body,omitempty"`
	SecondUser *User           `json:"second_user,omitempty"`
}

// User is another user's authentication.
type User struct {
	Headers map[string]string `json:"headers"`
}

// ReadTemplate reads and checks a --request file.
func ReadTemplate(path string) (Template, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return Template{}, fmt.Errorf("read request template: %w", err)
	}
	var t Template
	dec := json.NewDecoder(strings.NewReader(string(b)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&t); err != nil {
		return Template{}, fmt.Errorf("request template %s: %w", path, err)
	}
	if err := t.check(); err != nil {
		return Template{}, fmt.Errorf("request template %s: %w", path, err)
	}
	return t, nil
}

// check reports the first problem with t and fills its defaults.
func (t *Template) check() error {
	t.Method = strings.ToUpper(strings.TrimSpace(t.Method))
	if t.Method == "" {
		t.Method = http.MethodPost
	}
	if !strings.HasPrefix(t.Path, "/") {
		return fmt.Errorf("path %q must start with /", t.Path)
	}
	switch t.Encoding {
	case "":
		t.Encoding = "json"
	case "json", "form":
	default:
		return fmt.Errorf("encoding %q: must be json or form", t.Encoding)
	}
	var obj map[string]any
	if err := json.Unmarshal(t.Body, &obj); err != nil || obj == nil {
		return errors.New("body must be a JSON object (the request's parameters)")
	}
	if len(t.AltBody) == 0 {
		alt, err := alter(t.Body)
		if err != nil {
			return err
		}
		t.AltBody = alt
	} else if err := json.Unmarshal(t.AltBody, &obj); err != nil || obj == nil {
		return errors.New("alt_body must be a JSON object")
	}
	for name := range t.Headers {
		if strings.EqualFold(name, "Idempotency-Key") || strings.EqualFold(name, replayauth.Header) {
			return fmt.Errorf("headers must not set %s: each scenario sets its own", name)
		}
	}
	return nil
}

// Config is what a run needs. APIURL and Template are required; the
// rest widens what is checked.
type Config struct {
	APIURL   string
	Template Template
	// Pool, when set, is the API's database: the checks that read
	// idempotency_keys and staged_jobs run, and abandoned keys are made.
	// The API's own role will do (SELECT, INSERT, UPDATE on
	// idempotency_keys, SELECT on staged_jobs); one that can also read
	// staged_jobs_dead and river_job sees jobs the enqueuer moves.
	Pool *pgxpool.Pool
	// Secrets, when set with Pool, are the completer's replay secrets:
	// the signed-replay scenarios run.
	Secrets []replayauth.Secret
	// MismatchStatus, when set, pins the status a reused key with other
	// parameters must get, one of MismatchStatuses; zero accepts any of
	// them, and the params-mismatch scenario reports which it saw.
	MismatchStatus int
	// Concurrency is how many requests race for one key (default 8).
	Concurrency int
	// RequestTimeout bounds each request (default 10 s).
	RequestTimeout time.Duration
	// HTTPClient sends the requests (default: one of its own).
	HTTPClient *http.Client
	// Only, when set, names the scenarios to run.
	Only []string
}

// Validate checks the configuration and fills its defaults.
func (c *Config) Validate() error {
	if c.APIURL == "" {
		return errors.New("conformance: APIURL is required")
	}
	c.APIURL = strings.TrimRight(c.APIURL, "/")
	if err := c.Template.check(); err != nil {
		return fmt.Errorf("conformance: %w", err)
	}
	if c.MismatchStatus != 0 && MismatchStatuses[c.MismatchStatus] == "" {
		return fmt.Errorf("conformance: MismatchStatus %d: must be one of %s", c.MismatchStatus, mismatchStatusList())
	}
	if c.Concurrency == 0 {
		c.Concurrency = 8
	}
	if c.Concurrency < 2 {
		return fmt.Errorf("conformance: Concurrency %d: at least 2 requests must race", c.Concurrency)
	}
	if c.RequestTimeout <= 0 {
		c.RequestTimeout = 10 * time.Second
	}
	if c.HTTPClient == nil {
		c.HTTPClient = &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	}
	for _, name := range c.Only {
		if scenarioNamed(name) == nil {
			var names []string
			for _, s := range Scenarios() {
				names = append(names, s.Name)
			}
			return fmt.Errorf("conformance: no scenario named %q; the scenarios are: %s", name, strings.Join(names, ", "))
		}
	}
	return nil
}

// MismatchStatuses are the statuses a correct API may answer a reused key
// with other parameters with, each with whose choice it is: the protocol
// is that the request is refused and never run, not which 4xx says so.
var MismatchStatuses = map[int]string{
	http.StatusBadRequest:          "Stripe's",
	http.StatusConflict:            "the article's",
	http.StatusUnprocessableEntity: "the IETF draft's and idem's",
}

// mismatchStatusList is MismatchStatuses' codes, in order, for messages.
func mismatchStatusList() string {
	codes := make([]int, 0, len(MismatchStatuses))
	for c := range MismatchStatuses {
		codes = append(codes, c)
	}
	sort.Ints(codes)
	parts := make([]string, len(codes))
	for i, c := range codes {
		parts[i] = fmt.Sprintf("%d (%s)", c, MismatchStatuses[c])
	}
	return strings.Join(parts, ", ")
}

// Outcome of a scenario.
const (
	Pass = "pass"
	Fail = "fail"
	Skip = "skip" // not run: what it needs was not given
)

// Result is one scenario's outcome.
type Result struct {
	Name      string        `json:"name"`
	Outcome   string        `json:"outcome"`
	Why       string        `json:"why,omitempty"` // why it failed or was skipped, or a note on a pass
	Rationale string        `json:"rationale"`
	Doc       string        `json:"doc"`
	Took      time.Duration `json:"took_ns"`
}

// Report is a whole run.
type Report struct {
	APIURL  string   `json:"api_url"`
	Results []Result `json:"results"`
	Passed  int      `json:"passed"`
	Failed  int      `json:"failed"`
	Skipped int      `json:"skipped"`
}

// OK reports whether no scenario failed.
func (r Report) OK() bool { return r.Failed == 0 }

// FailedNames are the failed scenarios' names, in report order.
func (r Report) FailedNames() []string {
	var out []string
	for _, res := range r.Results {
		if res.Outcome == Fail {
			out = append(out, res.Name)
		}
	}
	return out
}

// Run runs the scenarios against the API, in the order of Scenarios. An
// error means the run itself could not be done (the database cannot be
// read); what the API did wrong is in the Report.
func Run(ctx context.Context, cfg Config) (Report, error) {
	if err := cfg.Validate(); err != nil {
		return Report{}, err
	}
	r := &run{cfg: cfg, id: randomHex(6)}
	if cfg.Pool != nil {
		if err := r.openDB(ctx); err != nil {
			return Report{}, err
		}
		defer r.cleanup()
	}
	rep := Report{APIURL: cfg.APIURL}
	for _, s := range Scenarios() {
		if len(cfg.Only) > 0 && !contains(cfg.Only, s.Name) {
			continue
		}
		res := Result{Name: s.Name, Rationale: s.Rationale, Doc: s.Doc}
		start := time.Now()
		if why := r.missing(s.Needs); why != "" {
			res.Outcome, res.Why = Skip, why
		} else {
			note, err := s.Check(ctx, r)
			var ferr failure
			switch {
			case err == nil:
				res.Outcome, res.Why = Pass, note
			case errors.As(err, &ferr):
				res.Outcome, res.Why = Fail, ferr.msg
			case ctx.Err() != nil:
				return rep, ctx.Err()
			default:
				res.Outcome, res.Why = Fail, err.Error()
			}
		}
		res.Took = time.Since(start)
		switch res.Outcome {
		case Pass:
			rep.Passed++
		case Fail:
			rep.Failed++
		default:
			rep.Skipped++
		}
		rep.Results = append(rep.Results, res)
	}
	return rep, nil
}

// failure is a scenario's verdict that the API broke the protocol (any
// other error is the scenario's own trouble, reported as a failure too).
type failure struct{ msg string }

func (f failure) Error() string { return f.msg }

func failf(format string, args ...any) error { return failure{msg: fmt.Sprintf(format, args...)} }

// run is one conformance run's state.
type run struct {
	cfg Config
	id  string
	// db is the oracle, nil without a database or when the database
	// lacks idemd's schema; noSchema then says what is missing and how
	// to get it, and the scenarios that read the tables say so.
	db       *db
	noSchema string
	seed     *keyRow // a finished key of the API's, the model for the keys made
}

// key is a fresh key value for a scenario.
func (r *run) key(scenario string) string {
	return "idemctl-conformance-" + r.id + "-" + scenario + "-" + randomHex(3)
}

// missing says why a scenario needing needs cannot run, "" when it can.
func (r *run) missing(needs need) string {
	var m []string
	switch {
	case needs&needDB != 0 && r.cfg.Pool == nil:
		m = append(m, "--database-url")
	case needs&needDB != 0 && r.noSchema != "":
		m = append(m, r.noSchema)
	}
	if needs&needSecret != 0 && len(r.cfg.Secrets) == 0 {
		m = append(m, "the completer's replay secret (--auth-secret-file)")
	}
	if needs&needSecondUser != 0 && r.cfg.Template.SecondUser == nil {
		m = append(m, "second_user in the request file")
	}
	if len(m) == 0 {
		return ""
	}
	return "needs " + strings.Join(m, " and ")
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// alter returns body with its first number (in key order, a numeric
// string counting as one) plus one, or else its first string with
// "-other" appended: other parameters that
// the API still accepts, most likely.
func alter(body json.RawMessage) (json.RawMessage, error) {
	dec := json.NewDecoder(strings.NewReader(string(body)))
	dec.UseNumber()
	var obj map[string]any
	if err := dec.Decode(&obj); err != nil {
		return nil, fmt.Errorf("body: %w", err)
	}
	keys := sortedKeys(obj)
	for _, k := range keys {
		if n, ok := obj[k].(json.Number); ok {
			f, err := n.Float64()
			if err != nil {
				continue
			}
			obj[k] = json.Number(formatNumber(f + 1))
			return json.Marshal(obj)
		}
	}
	for _, k := range keys {
		// A number written as a string (form values) is a number.
		if s, ok := obj[k].(string); ok {
			if f, err := strconv.ParseFloat(s, 64); err == nil {
				obj[k] = formatNumber(f + 1)
				return json.Marshal(obj)
			}
		}
	}
	for _, k := range keys {
		if s, ok := obj[k].(string); ok {
			obj[k] = s + "-other"
			return json.Marshal(obj)
		}
	}
	return nil, errors.New("body has no top-level number or string to change: give alt_body, a body with other parameters")
}

func sortedKeys(m map[string]any) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// formatNumber writes f as an integer when it is one.
func formatNumber(f float64) string { return strconv.FormatFloat(f, 'f', -1, 64) }
