package ctl_test

import (
	"encoding/json"
	"encoding/xml"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
)

// forgetfulAPI ignores Idempotency-Key: every request is a new order.
func forgetfulAPI(t *testing.T) string {
	t.Helper()
	var n atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"order_id":%d}`, n.Add(1))
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

// keyCheckingAPI refuses a missing, empty or over-long key and does
// nothing else right.
func keyCheckingAPI(t *testing.T) string {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if k := r.Header.Get("Idempotency-Key"); k == "" || len(k) > 255 {
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		w.WriteHeader(http.StatusCreated)
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

func requestFile(t *testing.T) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "request.json")
	if err := os.WriteFile(p, []byte(`{"method": "POST", "path": "/orders",
		"headers": {"Authorization": "Bearer user-1"}, "body": {"sku": "book", "quantity": 2}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// conformanceArgs is a conformance run that passes (the one scenario it
// runs), for the read commands' output test.
func conformanceArgs(t *testing.T) []string {
	return []string{"conformance", "--api-url", keyCheckingAPI(t), "--request", requestFile(t), "--scenario", "key-required"}
}

// TestConformanceWithoutDatabase: without --database-url conformance runs
// what a client can see, skips the rest saying what they need, names the
// replay scenario first for an API that ignores keys, and exits 1.
func TestConformanceWithoutDatabase(t *testing.T) {
	t.Setenv("DATABASE_URL", "")
	api, req := forgetfulAPI(t), requestFile(t)
	junit := filepath.Join(t.TempDir(), "conformance.xml")
	code, out, errs := run(t, "conformance", "--api-url", api, "--request", req, "--junit", junit)
	if code != 1 {
		t.Fatalf("exit %d, want 1:\n%s%s", code, out, errs)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if !strings.HasPrefix(lines[0], "FAIL  replay") || !strings.Contains(lines[0], "docs/api-authors.md#what-a-replay-returns") {
		t.Errorf("first line %q, want the replay scenario's failure with its doc link", lines[0])
	}
	for _, want := range []string{"SKIP  stored-response", "needs --database-url", "FAIL  key-required", "first failure: replay"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	if !strings.Contains(errs, "first replay") {
		t.Errorf("stderr %q", errs)
	}

	b, err := os.ReadFile(junit)
	if err != nil {
		t.Fatal(err)
	}
	var suite struct {
		Failures int `xml:"failures,attr"`
		Skipped  int `xml:"skipped,attr"`
		Cases    []struct {
			Name    string    `xml:"name,attr"`
			Failure *struct{} `xml:"failure"`
		} `xml:"testcase"`
	}
	if err := xml.Unmarshal(b, &suite); err != nil {
		t.Fatalf("junit: %v\n%s", err, b)
	}
	if suite.Failures == 0 || suite.Skipped == 0 || suite.Cases[0].Name != "replay" || suite.Cases[0].Failure == nil {
		t.Errorf("junit: %+v", suite)
	}

	code, out, _ = run(t, "conformance", "--api-url", api, "--request", req, "-o", "json")
	var rep struct {
		Failed  int `json:"failed"`
		Results []struct {
			Name, Outcome, Why, Doc string
		} `json:"results"`
	}
	if code != 1 || json.Unmarshal([]byte(out), &rep) != nil || rep.Failed != suite.Failures || rep.Results[0].Outcome != "fail" {
		t.Errorf("-o json: exit %d, %+v\n%s", code, rep, out)
	}

	if code, out, errs := run(t, conformanceArgs(t)...); code != 0 || !strings.HasPrefix(out, "PASS  key-required") {
		t.Errorf("a passing run: exit %d\n%s%s", code, out, errs)
	}
}

// TestConformanceWithDatabase: with --database-url the table checks run
// (an API that stores no key fails them), and a replay secret is read as
// the completer reads it: a bad one is a configuration error that names
// the file and never shows the secret.
func TestConformanceWithDatabase(t *testing.T) {
	url, _ := setup(t)
	api, req := forgetfulAPI(t), requestFile(t)
	code, out, errs := run(t, "--database-url", url, "conformance", "--api-url", api, "--request", req, "--scenario", "stored-response")
	if code != 1 || !strings.Contains(out, "FAIL  stored-response") || !strings.Contains(out, "0 rows") {
		t.Errorf("exit %d\n%s%s", code, out, errs)
	}

	secret := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(secret, []byte("too-short-to-sign"), 0o600); err != nil {
		t.Fatal(err)
	}
	code, out, errs = run(t, "--database-url", url, "conformance", "--api-url", api, "--request", req, "--auth-secret-file", secret)
	if code != 2 || !strings.Contains(errs, secret) || strings.Contains(out+errs, "too-short-to-sign") {
		t.Errorf("short secret: exit %d\n%s%s", code, out, errs)
	}

	for _, args := range [][]string{
		{"conformance", "--request", req},
		{"conformance", "--api-url", api},
		{"conformance", "--api-url", api, "--request", req, "--mismatch-status", "418"},
		{"conformance", "--api-url", api, "--request", req, "--scenario", "no-such"},
	} {
		if code, _, errs := run(t, append([]string{"--database-url", url}, args...)...); code != 2 {
			t.Errorf("%v: exit %d, want 2 (%s)", args, code, errs)
		}
	}
	// An unknown scenario is answered with the names there are.
	if _, _, errs := run(t, "conformance", "--api-url", api, "--request", req, "--scenario", "no-such"); !strings.Contains(errs, `no scenario named "no-such"; the scenarios are: replay, stored-response, params-mismatch`) {
		t.Errorf("--scenario no-such does not list the scenarios:\n%s", errs)
	}
}
