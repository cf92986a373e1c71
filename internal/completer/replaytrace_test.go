package completer

import (
	"context"
	"net/http"
	"net/http/httptest"
	"regexp"
	"sync"
	"testing"

	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/idemd/idemd/internal/testing/dbtest"
)

// W3C Trace Context, version 00: version-trace_id-parent_id-flags, lower-case
// hex.
var traceparentRE = regexp.MustCompile(`^00-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$`)

// Every replay attempt carries a valid traceparent of a new trace, sampled,
// whose trace id the completer logs with the attempt's outcome.
func TestReplayCarriesATraceparent(t *testing.T) {
	pool := dbtest.NewPool(t)
	api := newTestAPI(t, pool, func(_ string, n int) action {
		if n == 1 {
			return actFail500
		}
		return actFinish
	})
	var (
		mu           sync.Mutex
		traceparents []string
	)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		traceparents = append(traceparents, r.Header.Values("traceparent")...)
		if len(r.Header.Values("tracestate")) > 0 {
			t.Errorf("tracestate %q: the completer has no trace state to send", r.Header.Values("tracestate"))
		}
		mu.Unlock()
		api.serve(w, r)
	}))
	t.Cleanup(srv.Close)

	core, logs := observer.New(zap.InfoLevel)
	cfg := testConfig(srv.URL)
	cfg.Logger = zap.New(core)
	svc := newTestService(t, pool, cfg)
	insertKeys(t, pool, "tp", 1, "started")

	ctx := context.Background()
	for range 2 { // the failed attempt, then its retry
		if _, err := svc.RunOnce(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if r := getKey(t, pool, "tp-1"); r.RecoveryPoint != "finished" {
		t.Fatalf("key not finished after its retry: %+v", r)
	}

	mu.Lock()
	defer mu.Unlock()
	if len(traceparents) != 2 {
		t.Fatalf("traceparent headers %q, want one per request (2)", traceparents)
	}
	var traces []trace.SpanContext
	for _, h := range traceparents {
		if !traceparentRE.MatchString(h) {
			t.Fatalf("traceparent %q is not W3C trace context 00", h)
		}
		sc := trace.SpanContextFromContext(propagation.TraceContext{}.Extract(ctx, propagation.MapCarrier{"traceparent": h}))
		if !sc.IsValid() || !sc.IsSampled() {
			t.Fatalf("traceparent %q: %+v, want a valid, sampled span context", h, sc)
		}
		traces = append(traces, sc)
	}
	if traces[0].TraceID() == traces[1].TraceID() || traces[0].SpanID() == traces[1].SpanID() {
		t.Fatalf("two attempts share a trace or span: %q", traceparents)
	}

	// The failed attempt's log line names its trace.
	failed := logs.FilterMessage("replay failed, will retry").All()
	if len(failed) != 1 {
		t.Fatalf("%d 'replay failed' lines, want 1", len(failed))
	}
	if got := failed[0].ContextMap()["trace_id"]; got != traces[0].TraceID().String() {
		t.Fatalf("failed attempt logged trace_id %v, want %s (its traceparent %s)", got, traces[0].TraceID(), traceparents[0])
	}
}

func TestReplayTraceIsNewEachTime(t *testing.T) {
	seen := map[trace.TraceID]bool{}
	for range 1000 {
		sc := replayTrace()
		if !sc.IsValid() || !sc.IsSampled() || sc.IsRemote() {
			t.Fatalf("%+v", sc)
		}
		if seen[sc.TraceID()] {
			t.Fatalf("trace id %s twice", sc.TraceID())
		}
		seen[sc.TraceID()] = true
	}
}
