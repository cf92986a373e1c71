package idem

import (
	"context"
	"encoding/json"

	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// The job metadata keys of W3C trace context. River's OpenTelemetry
// middleware (github.com/riverqueue/rivercontrib/otelriver, with
// MiddlewareConfig.EnableTracePropagation) reads exactly these top-level
// string fields of a job's metadata when it works the job, with the W3C
// propagator, and links its work span to the span they name.
const (
	MetadataTraceparent = "traceparent"
	MetadataTracestate  = "tracestate"
)

// withTraceContext returns metadata with the span context of ctx added
// under MetadataTraceparent (and MetadataTracestate when the trace has
// state), as otelriver's own insert middleware would write it.
//
// metadata is returned unchanged when ctx carries no valid span context,
// when metadata already has either key (the caller's own trace context
// wins), or when it is not a JSON object (the enqueuer dead-letters such
// metadata as invalid_metadata; idem does not decide that here). Empty
// metadata becomes an object holding only the trace context.
//
// The W3C propagator is used rather than otel.GetTextMapPropagator():
// otelriver reads with the W3C propagator whatever the application set
// globally, and the global one is a no-op until the application sets it.
func withTraceContext(ctx context.Context, metadata json.RawMessage) (json.RawMessage, error) {
	if !trace.SpanContextFromContext(ctx).IsValid() {
		return metadata, nil
	}
	carrier := propagation.MapCarrier{}
	propagation.TraceContext{}.Inject(ctx, carrier)
	if carrier[MetadataTraceparent] == "" {
		return metadata, nil
	}
	m := map[string]json.RawMessage{}
	if len(metadata) > 0 {
		var existing map[string]json.RawMessage
		if err := json.Unmarshal(metadata, &existing); err != nil || existing == nil {
			return metadata, nil
		}
		if _, ok := existing[MetadataTraceparent]; ok {
			return metadata, nil
		}
		if _, ok := existing[MetadataTracestate]; ok {
			return metadata, nil
		}
		m = existing
	}
	for k, v := range carrier {
		if k != MetadataTraceparent && k != MetadataTracestate {
			continue
		}
		b, err := json.Marshal(v)
		if err != nil {
			return nil, err
		}
		m[k] = b
	}
	return json.Marshal(m)
}
