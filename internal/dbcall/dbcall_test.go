package dbcall

import (
	"context"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/idemd/idemd/internal/config"
)

// A Unix socket has no TCP options to set: Dial connects without them.
func TestDialUnixSocket(t *testing.T) {
	path := t.TempDir() + "/s"
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	c, err := Dial(context.Background(), "unix", path)
	if err != nil {
		t.Fatalf("dial a Unix socket: %v", err)
	}
	c.Close()
}

// Connections gives a connection without connect_timeout the bound, keeps
// one the URL set, and replaces libpq's "forever" (0).
func TestConnectionsConnectTimeout(t *testing.T) {
	for url, want := range map[string]time.Duration{
		"postgres://u@h/db":                   7 * time.Second,
		"postgres://u@h/db?connect_timeout=3": 3 * time.Second,
		"postgres://u@h/db?connect_timeout=0": 7 * time.Second,
	} {
		cc, err := pgconn.ParseConfig(url)
		if err != nil {
			t.Fatal(err)
		}
		Connections(cc, 7*time.Second)
		if cc.ConnectTimeout != want {
			t.Errorf("%s: connect timeout %s, want %s", url, cc.ConnectTimeout, want)
		}
		if cc.DialFunc == nil {
			t.Errorf("%s: no DialFunc", url)
		}
	}
}

// blocked is a call the database never answers: it returns only when its
// context ends, with what pgx returns then.
func blocked(ctx context.Context) error {
	<-ctx.Done()
	return errors.New("enqueuer batch: begin: timeout: " + ctx.Err().Error())
}

// clock is the degraded mode's clock in a test, moved by hand.
type clock struct{ t time.Time }

func (c *clock) now() time.Time          { return c.t }
func (c *clock) advance(d time.Duration) { c.t = c.t.Add(d) }

// observed is Bounds with bound whose lines go to the returned observer
// and whose clock the test moves by hand.
func observed(bound time.Duration) (*Bounds, *clock, *observer.ObservedLogs) {
	core, logs := observer.New(zap.InfoLevel)
	b := New(bound, zap.New(core))
	clk := &clock{t: time.Unix(1e9, 0)}
	b.now = clk.now
	return b, clk, logs
}

// A call that runs out of its bound is a TimeoutError naming the
// operation; the degraded mode it starts is logged once, counted per
// call, and reported by Fault until a call begun after it answers; it
// ends, logged once, when the database has answered for a bound's time
// with no call running out (a timeout in between is part of the same
// fault, not a new one).
func TestDoTimesOutAndTheDegradedModeEnds(t *testing.T) {
	const bound = 20 * time.Millisecond
	b, clk, logs := observed(bound)
	ctx := context.Background()
	answer := func() {
		t.Helper()
		clk.advance(time.Millisecond)
		if err := b.Do(ctx, "completer: claim", func(context.Context) error { return nil }); err != nil {
			t.Fatal(err)
		}
	}
	timeOut := func() {
		t.Helper()
		clk.advance(time.Millisecond)
		err := b.Do(ctx, "enqueuer batch", blocked)
		var te *TimeoutError
		if !errors.As(err, &te) || te.Op != "enqueuer batch" || te.Bound != bound {
			t.Fatalf("Do of a call that never answers: %v, want a TimeoutError of enqueuer batch", err)
		}
	}
	for range 3 {
		timeOut()
	}
	if got := testutil.ToFloat64(b.timeouts.WithLabelValues("enqueuer batch")); got != 3 {
		t.Errorf("idemd_database_call_timeouts_total{operation=enqueuer batch} = %v, want 3", got)
	}
	if got := testutil.ToFloat64(b.unanswered); got != 1 {
		t.Errorf("idemd_database_unanswered = %v, want 1", got)
	}
	fault := b.Fault()
	if fault == nil || !strings.HasPrefix(fault.Error(), "database did not answer within 20ms: enqueuer batch: begin") {
		t.Fatalf("Fault = %v, want the operation and the bound", fault)
	}

	answer()
	if f := b.Fault(); f != nil {
		t.Fatalf("Fault after a call answered: %v", f)
	}
	timeOut() // what the fault left: the same degraded mode
	answer()
	clk.advance(bound)
	answer()
	if n := logs.FilterMessageSnippet("did not answer").Len(); n != 1 {
		t.Errorf("%d lines say the database did not answer, want 1", n)
	}
	if got := testutil.ToFloat64(b.unanswered); got != 0 {
		t.Errorf("idemd_database_unanswered = %v after the database answered for a bound, want 0", got)
	}
	ended := logs.FilterMessage("the database answers again").All()
	if len(ended) != 1 || ended[0].ContextMap()["calls_timed_out"] != int64(4) {
		t.Fatalf("end of the degraded mode logged %d times (%v), want once with 4 calls", len(ended), ended)
	}
	answer()
	if n := logs.FilterMessage("the database answers again").Len(); n != 1 {
		t.Errorf("a later answer logged the end again (%d lines)", n)
	}
}

// A call sent into a fault with a longer bound of its own (db-stats')
// that runs out after the fault has ended is counted but does not start
// the degraded mode again: that fault is over, and it was logged. A call
// begun after the end that runs out does.
func TestACallSentIntoAnEndedFaultDoesNotReopenIt(t *testing.T) {
	const bound = 20 * time.Millisecond
	b, clk, logs := observed(bound)
	ctx := context.Background()
	if err := b.Do(ctx, "enqueuer batch", blocked); !IsTimeout(err) {
		t.Fatalf("Do: %v, want a timeout", err)
	}
	// The long call is sent during the fault.
	sentAt := clk.t
	clk.advance(time.Millisecond)
	for range 2 {
		if err := b.Do(ctx, "completer: claim", func(context.Context) error { return nil }); err != nil {
			t.Fatal(err)
		}
		clk.advance(bound)
	}
	if got := testutil.ToFloat64(b.unanswered); got != 0 {
		t.Fatalf("idemd_database_unanswered = %v after the database answered for a bound, want 0", got)
	}
	// It runs out of its own (long) bound only now, after the end.
	b.timedOut(&TimeoutError{Op: "db-stats query", Bound: time.Hour, Err: context.DeadlineExceeded}, sentAt)
	if got := testutil.ToFloat64(b.unanswered); got != 0 {
		t.Errorf("idemd_database_unanswered = %v: a call sent into the ended fault reopened it", got)
	}
	if n := logs.FilterMessageSnippet("did not answer").Len(); n != 1 {
		t.Errorf("%d lines say the database did not answer, want 1 (the fault's)", n)
	}
	if got := testutil.ToFloat64(b.timeouts.WithLabelValues("db-stats query")); got != 1 {
		t.Errorf("the late call's timeout counted %v times, want 1", got)
	}
	clk.advance(time.Millisecond)
	if err := b.Do(ctx, "enqueuer batch", blocked); !IsTimeout(err) {
		t.Fatalf("Do: %v, want a timeout", err)
	}
	if got := testutil.ToFloat64(b.unanswered); got != 1 {
		t.Errorf("idemd_database_unanswered = %v after a call begun since the end ran out, want 1", got)
	}
	if n := logs.FilterMessageSnippet("did not answer").Len(); n != 2 {
		t.Errorf("%d lines say the database did not answer, want 2 (a new fault)", n)
	}
}

// An answer to a call sent before the last timeout proves nothing about
// now: the degraded mode goes on.
func TestAnAnswerFromBeforeTheFaultDoesNotEndIt(t *testing.T) {
	b := New(20*time.Millisecond, nil)
	ctx := context.Background()
	started, release := make(chan struct{}), make(chan struct{})
	answered := make(chan error)
	go func() {
		answered <- b.DoWithin(ctx, "slow", time.Hour, func(context.Context) error {
			close(started)
			<-release
			return nil
		})
	}()
	<-started
	if err := b.Do(ctx, "enqueuer batch", blocked); !IsTimeout(err) {
		t.Fatalf("Do: %v, want a timeout", err)
	}
	close(release)
	if err := <-answered; err != nil {
		t.Fatal(err)
	}
	if b.Fault() == nil {
		t.Fatal("an answer to a call begun before the timeout ended the degraded mode")
	}
}

// A call cut short by its caller (a shutdown) or failing on its own is
// not a timeout, and a timeout inside a call (connect_timeout) is one.
func TestDoTellsTimeoutsFromOtherEnds(t *testing.T) {
	b := New(time.Hour, nil)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := b.Do(ctx, "op", blocked); err == nil || IsTimeout(err) {
		t.Errorf("a call its caller cancelled: %v, want its own error, not a timeout", err)
	}
	refused := errors.New("connection refused")
	if err := b.Do(context.Background(), "op", func(context.Context) error { return refused }); err != refused {
		t.Errorf("a failed call: %v, want its error unchanged", err)
	}
	inner := func(ctx context.Context) error {
		cctx, cancel := context.WithTimeout(ctx, time.Millisecond)
		defer cancel()
		<-cctx.Done()
		return cctx.Err()
	}
	if err := b.Do(context.Background(), "op", inner); !IsTimeout(err) {
		t.Errorf("a deadline inside the call: %v, want a timeout", err)
	}
	if b.Fault() == nil {
		t.Error("the inner deadline did not start the degraded mode")
	}
}

// Nested calls: the outer bound running out is the outer operation's
// timeout, not the inner's.
func TestNestedCallsNameTheBoundThatRanOut(t *testing.T) {
	b := New(time.Hour, nil)
	err := b.DoWithin(context.Background(), "outer", 10*time.Millisecond, func(ctx context.Context) error {
		return b.Do(ctx, "inner", blocked)
	})
	var te *TimeoutError
	if !errors.As(err, &te) || te.Op != "outer" {
		t.Fatalf("got %v, want the outer call's timeout", err)
	}
	var inner *TimeoutError
	if errors.As(te.Err, &inner) {
		t.Fatalf("the inner call reported the outer bound as its own: %v", inner)
	}
}

// A nil Bounds (a service built without one) bounds calls by
// --database-timeout's default and records nothing.
func TestNilBounds(t *testing.T) {
	var b *Bounds
	if b.Timeout() != config.DatabaseDefaults().Timeout {
		t.Fatalf("nil Bounds: timeout %s, want the default %s", b.Timeout(), config.DatabaseDefaults().Timeout)
	}
	var deadline time.Time
	if err := b.Do(context.Background(), "op", func(ctx context.Context) error {
		deadline, _ = ctx.Deadline()
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if deadline.IsZero() {
		t.Fatal("a nil Bounds gave the call no deadline")
	}
	if b.Fault() != nil {
		t.Fatal("a nil Bounds reports a fault")
	}
}
