// Package backoff is idemd's one retry-delay rule: exponential growth with
// full jitter (each delay uniform below a ceiling that doubles per attempt,
// up to a cap), so replicas that failed together do not retry together.
package backoff

import (
	"math/rand/v2"
	"time"
)

// Delay is the delay before retry number attempt (1 = after the first
// failure): uniform in [0, min(max, base·2^(attempt-1))). jitter(n) must
// return a uniform value in [0, n); nil uses math/rand.
func Delay(attempt int, base, max time.Duration, jitter func(n int64) int64) time.Duration {
	c := Ceiling(attempt, base, max)
	if c <= 0 {
		return 0
	}
	if jitter == nil {
		jitter = rand.Int64N
	}
	return time.Duration(jitter(int64(c)))
}

// Ceiling is the upper bound of Delay for attempt: base doubled per attempt
// after the first, capped at max.
func Ceiling(attempt int, base, max time.Duration) time.Duration {
	if attempt < 1 {
		attempt = 1
	}
	ceil := base
	for i := 1; i < attempt && ceil < max; i++ {
		ceil *= 2
	}
	return min(ceil, max)
}
