package reaper

import (
	"testing"

	"github.com/robfig/cron/v3"
)

// TestScheduleParserIsTheCronJobs: --schedule reads exactly what a
// Kubernetes CronJob's schedule does (cron.ParseStandard, the controller's
// parser), so a schedule moved between the chart's reaper.schedule (the
// CronJob, which deploy/helm checks against cron.ParseStandard) and
// IDEMD_SCHEDULE keeps its meaning, and is refused by both or neither.
func TestScheduleParserIsTheCronJobs(t *testing.T) {
	for _, spec := range []string{
		"17 * * * *", "*/15 * * * *", "0 3 * * MON-FRI", "0 0 1 jan-dec/3 *", "5,35 */2 1-31 * ?", "  0 * * * *  ",
		"@hourly", "@daily", "@every 1h", "@every 90s",
		"", "every hour please", "* * * * * *", "60 * * * *", "0 0 * * 7", "5-3 * * * *", "*/0 * * * *", "@reboot", "@every 1d",
	} {
		_, kube := cron.ParseStandard(spec)
		_, own := cronParser.Parse(spec)
		if (kube == nil) != (own == nil) {
			t.Errorf("%q: CronJob parser %v, --schedule parser %v", spec, kube, own)
		}
	}
}
