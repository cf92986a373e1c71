package reaper

import (
	"time"

	"github.com/robfig/cron/v3"
)

// maxPassAge is how old the last successful run may be before /readyz
// fails: two intervals of the schedule (one run may find the lease held)
// plus the longest a run may take.
func maxPassAge(sched cron.Schedule, now time.Time, maxRuntime time.Duration) time.Duration {
	next := sched.Next(now)
	return 2*sched.Next(next).Sub(next) + maxRuntime
}
