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
