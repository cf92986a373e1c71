package conformance_test

import (
	"context"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/idemd/idemd/internal/conformance"
)

// TestReadTemplate: a request file is checked before any request is sent,
// and the mismatch scenario's other parameters change a value the API
// reads (a number, a numeric form string, else a string).
func TestReadTemplate(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	read := func(body string) (conformance.Template, error) {
		p := filepath.Join(dir, "r.json")
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return conformance.ReadTemplate(p)
	}
	for _, c := range []struct{ file, alt string }{
		{`{"path": "/rides", "body": {"origin_lat": 0.0, "b": "x"}}`, `{"b":"x","origin_lat":1}`},
		{`{"path": "/orders", "encoding": "form", "body": {"sku": "book", "quantity": "2"}}`, `{"quantity":"3","sku":"book"}`},
		{`{"path": "/notes", "body": {"text": "hi"}}`, `{"text":"hi-other"}`},
		{`{"path": "/x", "body": {"a": 1}, "alt_body": {"a": 5}}`, `{"a": 5}`},
	} {
		tmpl, err := read(c.file)
		if err != nil {
			t.Errorf("%s: %v", c.file, err)
			continue
		}
		if string(tmpl.AltBody) != c.alt || tmpl.Method != "POST" {
			t.Errorf("%s: alt %s, method %s; want %s, POST", c.file, tmpl.AltBody, tmpl.Method, c.alt)
		}
	}
	for _, c := range []struct{ file, want string }{
		{`{"path": "/x", "body": {"a": 1}, "bdy": {}}`, "unknown field"},
		{`{"path": "x", "body": {"a": 1}}`, "must start with /"},
		{`{"path": "/x", "body": [1]}`, "JSON object"},
		{`{"path": "/x", "body": {"a": 1}, "encoding": "xml"}`, "json or form"},
		{`{"path": "/x", "body": {"a": 1}, "headers": {"idempotency-key": "k"}}`, "each scenario sets its own"},
		{`{"path": "/x", "body": {"a": true}}`, "give alt_body"},
	} {
		if _, err := read(c.file); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: error %v, want %q", c.file, err, c.want)
		}
	}
}

// TestWithoutDatabase: without a database and a secret the scenarios a
// client can see run and pass against the order API, the others are
// skipped, each saying what it needs.
func TestWithoutDatabase(t *testing.T) {
	t.Parallel()
	h, err := newOrderAPI(ordersDB(t), []byte(testSecret), breaks{})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	rep, err := conformance.Run(context.Background(), conformance.Config{APIURL: srv.URL, Template: orderTemplate()})
	if err != nil {
		t.Fatal(err)
	}
	logReport(t, rep)
	ran := map[string]bool{}
	for _, r := range rep.Results {
		switch r.Outcome {
		case conformance.Pass:
			ran[r.Name] = true
		case conformance.Skip:
			if !strings.HasPrefix(r.Why, "needs --database-url") {
				t.Errorf("%s skipped: %s", r.Name, r.Why)
			}
		default:
			t.Errorf("%s failed: %s", r.Name, r.Why)
		}
	}
	for _, name := range []string{"replay", "params-mismatch", "key-required", "concurrent", "per-user"} {
		if !ran[name] {
			t.Errorf("%s did not run", name)
		}
	}
	if rep.Skipped != len(conformance.Scenarios())-5 {
		t.Errorf("skipped %d", rep.Skipped)
	}
}
