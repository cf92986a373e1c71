package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/idemd/idemd/internal/dbcall"
	"github.com/idemd/idemd/internal/opshttp"
)

// Skeleton is the part every idemd service shares (docs/architecture.md):
// Start, Stop and RunOnce, the main loop and the loops beside it,
// readiness, the backoff after a failed pass and the pass's summary line.
// A service fills in what is its own (its pass, when the next one is due,
// how old a pass may be) in New, and embeds the Skeleton (as River's
// services embed BaseStartStop), so Start, Stop and RunOnce are the
// Skeleton's own: one meaning of each for every service.
type Skeleton[R any] struct {
	// Name prefixes the Runner's errors.
	Name   string
	Logger *zap.Logger
	// Ready, optional, is /readyz's state: marked started by Start and
	// after every successful pass that ReadyAfter accepts.
	Ready *opshttp.Readiness
	// MaxPassAge, read at Start, is how old the last successful pass may
	// be before /readyz fails.
	MaxPassAge func() time.Duration

	// Pass is one pass: work until nothing is due right now, looking at
	// stop between units.
	Pass func(ctx context.Context, stop Stop) (R, error)
	// Next says how long to wait after a successful pass; Retry, after a
	// failed one (Loop).
	Next  func(last R) time.Duration
	Retry Retry
	// Wake, optional, starts a pass early (the enqueuer's notifications).
	Wake <-chan struct{}
	// First, optional, is read at Start: the delay of the first pass (the
	// reaper's first cron time).
	First func() time.Duration
	// Beside, optional, builds the loops that run beside the main loop
	// while the service runs; they are cancelled once it has stopped.
	Beside func() []Loop
	// Finally, optional, runs once the main loop and the loops beside it
	// have stopped: what the service gives back (a lease, a lock's state).
	Finally func(ctx context.Context)
	// CanStart, optional, is asked first by Start: a service that can
	// only run once in some configuration (the reaper without --schedule)
	// refuses Start with its error.
	CanStart func() error
	// ReadyAfter, optional, says whether a successful pass proves the
	// service works (a pass that read nothing proves nothing).
	ReadyAfter func(last R) bool

	// Summary is the message of the pass's summary line: logged at
	// SummaryLevel after a pass that Summarize finds worth a line, and
	// after every failed pass at error level with the error (info when
	// the shutdown cut the pass short; debug with QuietTimeouts when the
	// database did not answer a call within its bound). A pass's result is never nil,
	// even with an error, so what it committed is always in the line.
	Summary      string
	SummaryLevel zapcore.Level
	Summarize    func(last R, err error) (fields []zap.Field, worth bool)
	// QuietTimeouts logs a pass that failed because the database did not
	// answer a call within its bound at debug level in the loop, for a
	// service whose passes retry within seconds: internal/dbcall logs
	// when that fault begins and when it ends, and a line per retried
	// pass would say nothing new. A one-shot pass, and a service whose
	// every pass is worth its line (a reaper run), log it as any failure.
	QuietTimeouts bool

	runner Runner
	// setup names the runner and sets readiness's limit once: concurrent
	// Starts must not write them at the same time.
	setup sync.Once
}

// Start runs the main loop in the background until Stop or until ctx
// ends: a pass First after Start, then one whenever Wake delivers or the
// wait after the last pass has passed.
//
// A skeleton missing a required callback is refused here, with the names
// of every one missing, rather than panicking in its first pass.
func (k *Skeleton[R]) Start(ctx context.Context) error {
	if err := k.check(true); err != nil {
		return err
	}
	if k.CanStart != nil {
		if err := k.CanStart(); err != nil {
			return err
		}
	}
	k.setup.Do(func() {
		k.runner.Name = k.Name
		if k.Ready != nil && k.MaxPassAge != nil {
			k.Ready.SetMaxPassAge(k.MaxPassAge())
		}
	})
	if k.Ready != nil {
		// Before the loop can first mark a pass.
		k.Ready.MarkStarted(time.Now())
	}
	var first time.Duration
	if k.First != nil {
		first = k.First()
	}
	return k.runner.Start(ctx, func(ctx context.Context, stop <-chan struct{}) {
		if k.Finally != nil {
			defer k.Finally(ctx)
		}
		if k.Beside != nil {
			defer Beside(ctx, k.Beside()...)()
		}
		st := Stop{ch: stop}
		var last R
		Loop{
			Pass: func(ctx context.Context) error {
				var err error
				last, err = k.pass(ctx, st)
				return err
			},
			Next:  func() time.Duration { return k.Next(last) },
			Retry: k.Retry,
			Wake:  k.Wake,
			First: first,
			Passed: func(t time.Time) {
				if k.ReadyAfter == nil || k.ReadyAfter(last) {
					k.MarkReady(t)
				}
			},
		}.Run(ctx, stop)
	})
}

// Stop asks the pass in progress to end after its current unit, waits for
// it until ctx ends, then cancels it; it returns when nothing of the
// service runs any more (Runner.Stop).
func (k *Skeleton[R]) Stop(ctx context.Context) error {
	return k.runner.Stop(ctx)
}

// RunOnce is one pass run alone (--once, and what tests call): no stop
// request, nothing beside it; SIGTERM cancels ctx.
func (k *Skeleton[R]) RunOnce(ctx context.Context) (R, error) {
	if err := k.check(false); err != nil {
		var zero R
		return zero, err
	}
	return k.pass(ctx, OneShot)
}

// check names the required callbacks that are nil: Pass and Summarize,
// which every pass calls, and, for the loop, Next, which it calls after
// one.
func (k *Skeleton[R]) check(loop bool) error {
	var missing []string
	if k.Pass == nil {
		missing = append(missing, "Pass")
	}
	if loop && k.Next == nil {
		missing = append(missing, "Next")
	}
	if k.Summarize == nil {
		missing = append(missing, "Summarize")
	}
	if len(missing) > 0 {
		return fmt.Errorf("%s: skeleton: required callbacks not set: %s", k.Name, strings.Join(missing, ", "))
	}
	return nil
}

// MarkReady tells /readyz the service is doing its job, for a service
// whose pass can outlast /readyz's limit and marks after each unit too.
func (k *Skeleton[R]) MarkReady(t time.Time) {
	if k.Ready != nil {
		k.Ready.MarkPass(t)
	}
}

// pass runs the service's pass and logs its summary line.
func (k *Skeleton[R]) pass(ctx context.Context, stop Stop) (R, error) {
	res, err := k.Pass(ctx, stop)
	log := k.Logger
	if log == nil {
		log = zap.NewNop()
	}
	fields, worth := k.Summarize(res, err)
	switch {
	case err != nil && ctx.Err() != nil && errors.Is(err, ctx.Err()):
		// Cut short by the shutdown: not a failure of the service.
		log.Info(k.Summary, append(fields, zap.Error(err))...)
	case k.QuietTimeouts && !stop.OneShot() && dbcall.IsTimeout(err):
		log.Debug(k.Summary, append(fields, zap.Error(err))...)
	case err != nil:
		log.Error(k.Summary, append(fields, zap.Error(err))...)
	case worth:
		log.Log(k.SummaryLevel, k.Summary, fields...)
	}
	return res, err
}
