package tracetest

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivertype"
	"github.com/riverqueue/rivercontrib/otelriver"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	sdktracetest "go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemd/idemd/clients/clienttest"
	"github.com/idemd/idemd/idem"
	"github.com/idemd/idemd/internal/enqueuer"
	"github.com/idemd/idemd/internal/testing/dbtest"
	"github.com/idemd/idemd/internal/testing/testwait"
)

func TestMain(m *testing.M) { dbtest.Main(m) }

const wait = 2 * time.Minute

type receiptArgs struct {
	Ride int `json:"ride"`
}

func (receiptArgs) Kind() string { return "idemd_trace_receipt" }

// worked is what the worker saw of its job.
type worked struct {
	metadata []byte
	span     trace.SpanContext // the span in the worker's context: otelriver's work span
}

type receiptWorker struct {
	river.WorkerDefaults[receiptArgs]
	worked chan worked
}

func (w *receiptWorker) Work(ctx context.Context, job *river.Job[receiptArgs]) error {
	w.worked <- worked{metadata: job.Metadata, span: trace.SpanContextFromContext(ctx)}
	return nil
}

// parentFromMetadata is the worker middleware docs/api-authors.md offers
// to API authors who want the work span inside the API's trace: placed
// before otelriver, it puts the staged span context into ctx, and
// otelriver starts its work span from ctx.
var parentFromMetadata = river.WorkerMiddlewareFunc(func(ctx context.Context, job *rivertype.JobRow, doInner func(context.Context) error) error {
	var md struct {
		Traceparent string `json:"traceparent"`
		Tracestate  string `json:"tracestate"`
	}
	if json.Unmarshal(job.Metadata, &md) == nil && md.Traceparent != "" {
		ctx = propagation.TraceContext{}.Extract(ctx, propagation.MapCarrier{
			"traceparent": md.Traceparent, "tracestate": md.Tracestate,
		})
	}
	return doInner(ctx)
})

// run stages one job under an API span, lets the real enqueuer move it
// and a real River worker with otelriver (and plugins before it) work it.
// It returns the API span, the work span as exported and what the worker
// saw.
func run(t *testing.T, before ...rivertype.Plugin) (api sdktrace.ReadOnlySpan, work sdktrace.ReadOnlySpan, got worked, stagedID int64) {
	t.Helper()
	ctx := context.Background()
	db := clienttest.NewAPIDatabase(t)
	apiPool := newPool(t, db.APIURL) // the API's role: stages jobs, never reads River
	daemonPool := newPool(t, db.URL) // idemd_runtime: the enqueuer and, here, the worker

	// Spans of both sides go to one in-memory exporter; nothing global is
	// set: StageJob needs no propagator configured.
	exporter := sdktracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exporter))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })

	w := &receiptWorker{worked: make(chan worked, 1)}
	workers := river.NewWorkers()
	river.AddWorker(workers, w)
	plugins := append(before, otelriver.NewMiddleware(&otelriver.MiddlewareConfig{
		EnableTracePropagation: true,
		TracerProvider:         tp,
	}))
	rc, err := river.NewClient(riverpgxv5.New(daemonPool), &river.Config{
		Queues:            map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: 1}},
		Workers:           workers,
		Plugins:           plugins,
		FetchPollInterval: 200 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := rc.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stop(t, rc.Stop) })

	enq, err := enqueuer.New(enqueuer.Config{Settings: enqueuer.DefaultSettings(), Pool: daemonPool})
	if err != nil {
		t.Fatal(err)
	}
	if err := enq.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stop(t, enq.Stop) })

	// The API: a request's span, and a transaction that stages the job.
	apiCtx, span := tp.Tracer("rocketrides-api").Start(ctx, "POST /rides", trace.WithSpanKind(trace.SpanKindServer))
	tx, err := apiPool.Begin(apiCtx)
	if err != nil {
		t.Fatal(err)
	}
	stagedID, err = idem.StageJob(apiCtx, tx, receiptArgs{}.Kind(), receiptArgs{Ride: 7},
		&idem.StageOptions{Metadata: json.RawMessage(`{"source":"api"}`)})
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(apiCtx); err != nil {
		t.Fatal(err)
	}
	span.End()

	select {
	case got = <-w.worked:
	case <-time.After(wait):
		t.Fatal("the staged job was not worked")
	}
	// otelriver ends its work span once the worker has returned.
	testwait.Until(t, wait, "the work span to be exported", func() bool {
		for _, s := range exporter.GetSpans().Snapshots() {
			if s.Name() == "river.work" {
				return true
			}
		}
		return false
	})
	for _, s := range exporter.GetSpans().Snapshots() {
		switch s.Name() {
		case "POST /rides":
			api = s
		case "river.work":
			work = s
		}
	}
	if api == nil {
		t.Fatal("the API span was not exported")
	}
	return api, work, got, stagedID
}

func newPool(t *testing.T, url string) *pgxpool.Pool {
	t.Helper()
	p, err := pgxpool.New(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

func stop(t *testing.T, f func(context.Context) error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := f(ctx); err != nil {
		t.Error(err)
	}
}

// checkMetadata checks the River job's metadata: the API's traceparent
// under the key otelriver reads, beside the API's own field and the
// enqueuer's.
func checkMetadata(t *testing.T, md []byte, api trace.SpanContext, stagedID int64) {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(md, &m); err != nil {
		t.Fatalf("job metadata %s: %v", md, err)
	}
	want := "00-" + api.TraceID().String() + "-" + api.SpanID().String() + "-01"
	if m[idem.MetadataTraceparent] != want {
		t.Errorf("metadata traceparent = %v, want %s (metadata %s)", m[idem.MetadataTraceparent], want, md)
	}
	if m["source"] != "api" {
		t.Errorf("the API's own metadata is lost: %s", md)
	}
	if id, _ := m["idemd_staged_id"].(float64); int64(id) != stagedID {
		t.Errorf("idemd_staged_id = %v, want %d", m["idemd_staged_id"], stagedID)
	}
}

// TestWorkSpanLinksToTheAPISpan is the API author's setup as otelriver
// documents it: the work span starts a trace of its own (otelriver's
// choice: a job may run long after the request) with a link to the API
// span that staged the job.
func TestWorkSpanLinksToTheAPISpan(t *testing.T) {
	api, work, got, stagedID := run(t)
	checkMetadata(t, got.metadata, api.SpanContext(), stagedID)
	if !work.SpanContext().Equal(got.span) {
		t.Errorf("the worker ran in span %v, the exported work span is %v", got.span, work.SpanContext())
	}
	links := work.Links()
	if len(links) != 1 {
		t.Fatalf("work span has %d links, want 1 (to the API span)", len(links))
	}
	l := links[0].SpanContext
	if l.TraceID() != api.SpanContext().TraceID() || l.SpanID() != api.SpanContext().SpanID() {
		t.Errorf("work span links to %s/%s, want the API span %s/%s",
			l.TraceID(), l.SpanID(), api.SpanContext().TraceID(), api.SpanContext().SpanID())
	}
	if !l.IsRemote() || !l.IsSampled() {
		t.Errorf("link %+v: want a remote, sampled span context", l)
	}
	if work.Parent().IsValid() {
		t.Errorf("otelriver links, it does not parent: work span's parent is %v", work.Parent())
	}
}

// TestWorkSpanIsAChildWithParentMiddleware adds docs/api-authors.md's
// middleware before otelriver: the work span is then in the API's trace,
// a child of the API span, and still linked to it.
func TestWorkSpanIsAChildWithParentMiddleware(t *testing.T) {
	api, work, got, stagedID := run(t, parentFromMetadata)
	checkMetadata(t, got.metadata, api.SpanContext(), stagedID)
	if !work.SpanContext().Equal(got.span) {
		t.Errorf("the worker ran in span %v, the exported work span is %v", got.span, work.SpanContext())
	}
	if got.span.TraceID() != api.SpanContext().TraceID() {
		t.Errorf("work span's trace %s, want the API's %s", got.span.TraceID(), api.SpanContext().TraceID())
	}
	if p := work.Parent(); p.SpanID() != api.SpanContext().SpanID() || !p.IsRemote() {
		t.Errorf("work span's parent %v, want the API span %s (remote)", p, api.SpanContext().SpanID())
	}
	if len(work.Links()) != 1 || work.Links()[0].SpanContext.SpanID() != api.SpanContext().SpanID() {
		t.Errorf("work span links %v, want one to the API span", work.Links())
	}
}
