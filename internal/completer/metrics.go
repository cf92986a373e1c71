package completer

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// Outcome of one claimed key, the label of idemd_completer_replays_total.
type Outcome string

const (
	// OutcomeFinished: the key is finished (whatever final status the API stored).
	OutcomeFinished Outcome = "finished"
	// OutcomeInProgress: the API answered 409, a live request holds the key.
	OutcomeInProgress Outcome = "in_progress"
	// OutcomeRetry: 5xx, 429, timeout or connection error; retried with backoff.
	OutcomeRetry Outcome = "retry"
	// OutcomeUnauthorized: 401/403 on an unfinished key (misconfigured
	// secret); a failed attempt.
	OutcomeUnauthorized Outcome = "unauthorized"
	// OutcomeRejected: another answer that left the key unfinished (4xx,
	// 3xx, 2xx without finishing); a failed attempt.
	OutcomeRejected Outcome = "rejected"
	// OutcomeGaveUp: attempts or horizon exhausted; flagged for review.
	OutcomeGaveUp Outcome = "gave_up"
	// OutcomeDeferred: released without a request and without counting an
	// attempt (breaker open, lease too short, shutting down).
	OutcomeDeferred Outcome = "deferred"
	// OutcomeLeaseLost: our lease no longer matched when we came to write.
	OutcomeLeaseLost Outcome = "lease_lost"
	// OutcomeGone: the key was deleted (reaped) meanwhile.
	OutcomeGone Outcome = "gone"
)

// allOutcomes lists every outcome above: each gets its series at 0 when the
// process starts, so the first replay of an outcome is an increase
// Prometheus sees.
var allOutcomes = []Outcome{OutcomeFinished, OutcomeInProgress, OutcomeRetry, OutcomeUnauthorized, OutcomeRejected, OutcomeGaveUp, OutcomeDeferred, OutcomeLeaseLost, OutcomeGone}

type metrics struct {
	replays      *prometheus.CounterVec
	pending      *prometheus.GaugeVec
	oldestAge    prometheus.Gauge
	breakerState prometheus.Gauge
	openReviews  *prometheus.GaugeVec
	oldestReview prometheus.Gauge
	breakerOpens prometheus.Counter
	keyFailures  prometheus.Counter
	duration     prometheus.Histogram
	claimed      prometheus.Counter
	// concurrencyLimit: congestion.go.
	concurrencyLimit prometheus.Gauge
	// keysBelowMark: mark.go.
	keysBelowMark prometheus.Counter
}

// newMetrics creates the completer's collectors and registers them with reg
// (nil: not registered, for tests).
func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		replays: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "idemd_completer_replays_total",
			Help: "Claimed keys by outcome (finished, in_progress, retry, unauthorized, rejected, gave_up, deferred, lease_lost, gone).",
		}, []string{"outcome"}),
		pending: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "idemd_completer_keys_pending",
			Help: "Unfinished keys the completer has not given up on, by recovery point.",
		}, []string{"recovery_point"}),
		oldestAge: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "idemd_completer_oldest_unfinished_key_age_seconds",
			Help: "Age of the oldest unfinished key not given up (0 when none), by the database clock.",
		}),
		// Reviews are global, not the completer's own, but the completer is
		// the daemon that always runs and already samples the database for
		// its backlog gauges; the reaper may live only as a CronJob.
		openReviews: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "idemd_completer_open_reviews",
			Help: "Unresolved reviews in idempotency_key_reviews, by reason (every replica reports the same database-wide count).",
		}, []string{"reason"}),
		oldestReview: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "idemd_completer_oldest_open_review_age_seconds",
			Help: "Age of the oldest unresolved review (0 when none), by the database clock.",
		}),
		breakerState: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "idemd_completer_breaker_state",
			Help: "Circuit breaker state: 0 closed, 1 half-open, 2 open.",
		}),
		breakerOpens: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "idemd_completer_breaker_opens_total",
			Help: "Times the circuit breaker opened.",
		}),
		keyFailures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "idemd_completer_key_failures_total",
			Help: "Failed replays taken for the key's own fault (the key failed again after the API answered other keys), which leave the circuit breaker alone.",
		}),
		duration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "idemd_completer_replay_duration_seconds",
			Help:    "Duration of replay HTTP requests.",
			Buckets: prometheus.ExponentialBuckets(0.005, 2, 14),
		}),
		claimed: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "idemd_completer_claimed_total",
			Help: "Keys claimed (leased) by this process.",
		}),
		concurrencyLimit: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "idemd_completer_concurrency_limit",
			Help: "Replays this process lets in flight at once: --concurrency, lowered while replays meet conflicts in the API (409 on keys no request holds) and raised again as they clear.",
		}),
		keysBelowMark: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "idemd_completer_keys_below_mark_total",
			Help: "Unfinished keys a full walk (every 30th pass) found tracked below the low-water mark the other passes start at: a key committed more than --grace + 1m after its transaction began, or inserted with an old created_at. Each waited up to 30 poll intervals longer. Should stay at 0.",
		}),
	}
	for _, o := range allOutcomes {
		m.replays.WithLabelValues(string(o))
	}
	if reg == nil {
		return m, nil
	}
	for _, c := range []prometheus.Collector{m.replays, m.pending, m.oldestAge, m.breakerState, m.openReviews, m.oldestReview, m.breakerOpens, m.keyFailures, m.duration, m.claimed, m.concurrencyLimit, m.keysBelowMark} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("completer: register metrics: %w", err)
		}
	}
	return m, nil
}
