package idem

import (
	"context"
	"encoding/json"
	"reflect"
	"testing"

	"go.opentelemetry.io/otel/trace"
)

func TestWithTraceContext(t *testing.T) {
	t.Parallel()
	traceID, _ := trace.TraceIDFromHex("4bf92f3577b34da6a3ce929d0e0e4736")
	spanID, _ := trace.SpanIDFromHex("00f067aa0ba902b7")
	state, err := trace.ParseTraceState("vendor=abc")
	if err != nil {
		t.Fatal(err)
	}
	sc := trace.NewSpanContext(trace.SpanContextConfig{TraceID: traceID, SpanID: spanID, TraceFlags: trace.FlagsSampled})
	sampled := trace.ContextWithSpanContext(context.Background(), sc)
	withState := trace.ContextWithSpanContext(context.Background(), sc.WithTraceState(state))
	unsampled := trace.ContextWithSpanContext(context.Background(), sc.WithTraceFlags(0))
	const tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"

	for _, tc := range []struct {
		name     string
		ctx      context.Context
		metadata string
		want     string // "" when metadata must come back unchanged
	}{
		{"no span, no metadata", context.Background(), ``, ``},
		{"no span keeps metadata", context.Background(), `{"a":1}`, ``},
		{"span, no metadata", sampled, ``, `{"traceparent":"` + tp + `"}`},
		{"span merges into metadata", sampled, `{"source":"api","n":12345678901234567890}`,
			`{"n":12345678901234567890,"source":"api","traceparent":"` + tp + `"}`},
		{"empty object", sampled, `{}`, `{"traceparent":"` + tp + `"}`},
		{"tracestate", withState, `{"a":"b"}`, `{"a":"b","traceparent":"` + tp + `","tracestate":"vendor=abc"}`},
		{"unsampled is still propagated", unsampled, ``,
			`{"traceparent":"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00"}`},
		{"caller's traceparent wins", sampled, `{"traceparent":"00-11111111111111111111111111111111-2222222222222222-01"}`, ``},
		{"caller's tracestate alone wins", sampled, `{"tracestate":"x=y"}`, ``},
		{"array is left to the enqueuer", sampled, `[1,2]`, ``},
		{"null is left to the enqueuer", sampled, `null`, ``},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := withTraceContext(tc.ctx, json.RawMessage(tc.metadata))
			if err != nil {
				t.Fatal(err)
			}
			if tc.want == "" {
				if string(got) != tc.metadata {
					t.Fatalf("metadata changed: %s -> %s", tc.metadata, got)
				}
				return
			}
			var g, w any
			if err := json.Unmarshal(got, &g); err != nil {
				t.Fatalf("%s: %v", got, err)
			}
			_ = json.Unmarshal([]byte(tc.want), &w)
			if !reflect.DeepEqual(g, w) {
				t.Fatalf("got %s, want %s", got, tc.want)
			}
			// Numbers the caller wrote are kept as written (no float64
			// round trip).
			if tc.name == "span merges into metadata" && string(got) != tc.want {
				t.Fatalf("got %s, want exactly %s", got, tc.want)
			}
		})
	}
}
