// Package tracetest proves that trace context crosses idemd end to end: an
// API span stages a job with idem.StageJob, the enqueuer moves it into
// River, and a River worker running River's OpenTelemetry middleware
// (github.com/riverqueue/rivercontrib/otelriver) finds the API's span in
// the job's metadata (docs/api-authors.md, "Tracing"). Its tests need
// PostgreSQL (internal/testing/dbtest) and nothing else: spans go to an in-memory
// exporter.
package tracetest
