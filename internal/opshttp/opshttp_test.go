package opshttp

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func TestEndpoints(t *testing.T) {
	var pingErr error
	ready := &Readiness{Ping: func(context.Context) error { return pingErr }}
	ready.SetMaxPassAge(time.Hour)
	reg := prometheus.NewRegistry()
	c := prometheus.NewCounter(prometheus.CounterOpts{Name: "idemd_test_total", Help: "test"})
	reg.MustRegister(c)
	c.Inc()
	srv, err := Start("127.0.0.1:0", Handler(reg, ready))
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Stop(context.Background()) //nolint:errcheck
	base := "http://" + srv.Addr

	if code, _ := get(t, base+"/readyz"); code != http.StatusServiceUnavailable {
		t.Fatalf("readyz before start: %d", code)
	}
	ready.MarkStarted(time.Now())
	if code, body := get(t, base+"/readyz"); code != http.StatusOK {
		t.Fatalf("readyz in first-pass grace: %d %s", code, body)
	}
	pingErr = errors.New("connection refused")
	if code, body := get(t, base+"/readyz"); code != http.StatusServiceUnavailable || !strings.Contains(body, "database unreachable") {
		t.Fatalf("readyz with database down: %d %s", code, body)
	}
	// Liveness never depends on the database.
	if code, _ := get(t, base+"/healthz"); code != http.StatusOK {
		t.Fatalf("healthz with database down: %d", code)
	}
	pingErr = nil
	if code, body := get(t, base+"/metrics"); code != http.StatusOK || !strings.Contains(body, "idemd_test_total 1") {
		t.Fatalf("metrics: %d %s", code, body)
	}
}

func TestReadinessStalePass(t *testing.T) {
	r := &Readiness{}
	r.SetMaxPassAge(time.Minute)
	now := time.Unix(1_800_000_000, 0)
	r.MarkStarted(now)
	if err := r.Check(context.Background(), now.Add(2*time.Minute)); err == nil {
		t.Fatal("no pass for two minutes after start, yet ready")
	}
	r.MarkPass(now.Add(2 * time.Minute))
	if err := r.Check(context.Background(), now.Add(2*time.Minute+30*time.Second)); err != nil {
		t.Fatalf("recent pass, not ready: %v", err)
	}
	if err := r.Check(context.Background(), now.Add(4*time.Minute)); err == nil {
		t.Fatal("stale pass, yet ready")
	}
}

// A database call that ran out of its bound makes /readyz fail at once
// with the call named, before the ping (which would only say the database
// is unreachable), and the ping and the schema check get CallTimeout.
func TestReadinessNamesTheUnansweredCall(t *testing.T) {
	var fault error
	var pingDeadline time.Time
	r := &Readiness{
		Database: func() error { return fault },
		Ping: func(ctx context.Context) error {
			pingDeadline, _ = ctx.Deadline()
			return errors.New("connection refused")
		},
		CallTimeout: 300 * time.Millisecond,
	}
	fault = errors.New("database did not answer within 10s: enqueuer batch: begin: timeout")
	start := time.Now()
	if err := r.Check(context.Background(), start); err == nil || err.Error() != fault.Error() {
		t.Fatalf("Check with an unanswered call: %v, want %v", err, fault)
	}
	if !pingDeadline.IsZero() {
		t.Fatal("the ping ran although a call had already said the database does not answer")
	}
	fault = nil
	if err := r.Check(context.Background(), start); err == nil || !strings.Contains(err.Error(), "database unreachable") {
		t.Fatalf("Check after the call answered, ping failing: %v", err)
	}
	if pingDeadline.IsZero() || pingDeadline.After(time.Now().Add(300*time.Millisecond)) {
		t.Fatalf("the ping's deadline %v is not CallTimeout's", pingDeadline)
	}
}
