package helm

import (
	"strings"
	"testing"

	"github.com/robfig/cron/v3"
)

// scheduleVectors are reaper.schedule values of every form robfig/cron's
// standard parser reads and of every way it refuses one: fields and their
// bounds, names, ranges, steps, lists, the descriptors and @every's
// durations, white space, and the parser's quirks (empty list items, a
// star's ignored range, leading zeros and a plus sign).
var scheduleVectors = []string{
	// Accepted.
	"17 * * * *", "0 * * * *", "*/15 * * * *", "0 0 * * *", "0 3 * * 1-5", "0 3 * * MON-FRI", "0 3 * * mon,wed,fri",
	"0 0 1 JAN *", "0 0 1 jan-dec/3 *", "5,35 */2 1-31 * ?", "59 23 31 12 6", "0-59/10 0-23/6 1/5 2-11 0-6",
	"  0 * * * *  ", "0\t*\t*\t*\t*", "0  3  *  *  *", "007 +3 * * *", "1,,2 * * * *", ",5 * * * *", "*-5 * * * *", "?/5 * * * *",
	"0 0 29 2 *", "0 0 * * SUN", "0 0 * * sat", "5/100 * * * *", "*/1 * * * *",
	"@yearly", "@annually", "@monthly", "@weekly", "@daily", "@midnight", "@hourly",
	"@every 1h", "@every 90s", "@every 1h30m", "@every 1.5h", "@every 0", "@every 500ms", "@every -1h", "@every 2h0m0s", "@every .5h",
	// Refused.
	"", "every hour please", "* * * *", "* * * * * *", "0 0 0 * * *", "60 * * * *", "0 24 * * *", "0 0 0 * *", "0 0 32 * *",
	"0 0 * 0 *", "0 0 * 13 *", "0 0 * * 7", "0 0 * * MON-SUN", "5-3 * * * *", "*/0 * * * *", "0/0 * * * *", "1-2-3 * * * *",
	"1/2/3 * * * *", "a * * * *", "jan * * * *", "0 0 * * MONDAY", "-1 * * * *", "1- * * * *", "*/-5 * * * *", "*/x * * * *",
	"0 0 1 DEC-JAN *", "99999999999999999999 * * * *", "*/99999999999999999999 * * * *",
	"CRON_TZ=UTC * * * *", "@every", "@every ", "@every 1 h", "@every 1hour", "@every 1h ", "@every h", "@every 1d", "@reboot", "@hourly ", " @hourly", "@HOURLY",
}

// TestScheduleAsTheParserReadsIt: the chart accepts exactly the schedules
// robfig/cron's standard parser accepts (cron.ParseStandard: the parser
// Kubernetes' CronJob controller runs, and the reaper's --schedule options,
// internal/reaper/config.go): "every hour please", which the schema used
// to pass, is refused when the chart renders, and every valid form renders.
// The one difference is a time zone in the schedule, which the parser
// reads but Kubernetes refuses beside spec.timeZone (reaper.timeZone).
func TestScheduleAsTheParserReadsIt(t *testing.T) {
	accepted, refused, byTemplate := 0, 0, 0
	for _, spec := range scheduleVectors {
		_, perr := cron.ParseStandard(spec)
		_, rerr := tryRenderChart(map[string]any{"reaper": map[string]any{"schedule": spec}})
		switch {
		case perr == nil && rerr != nil:
			t.Errorf("reaper.schedule %q: the parser accepts it, the chart refuses it: %v", spec, rerr)
		case perr != nil && rerr == nil:
			t.Errorf("reaper.schedule %q: the parser refuses it (%v), the chart renders it", spec, perr)
		case perr == nil:
			accepted++
		default:
			refused++
			if strings.Contains(rerr.Error(), "is not a cron schedule the reaper and Kubernetes accept") {
				byTemplate++ // past the schema's shape check, refused by the chart's parse
			}
			if !strings.Contains(rerr.Error(), "reaper.schedule") && !strings.Contains(rerr.Error(), "schedule") {
				t.Errorf("reaper.schedule %q: refused without naming reaper.schedule: %v", spec, rerr)
			}
		}
	}
	// Both sides of the comparison are exercised, and the render-time
	// check, not only the schema's pattern.
	if accepted < 30 || refused < 30 || byTemplate < 20 {
		t.Errorf("%d vectors accepted, %d refused by the parser, %d of them by the chart's render-time check: the vectors no longer cover each", accepted, refused, byTemplate)
	}
	t.Logf("%d vectors accepted, %d refused (%d by the render-time check, the rest by the schema's pattern)", accepted, refused, byTemplate)
	for _, spec := range []string{"CRON_TZ=Europe/Paris 0 3 * * *", "TZ=UTC 0 3 * * *"} {
		if _, err := cron.ParseStandard(spec); err != nil {
			t.Errorf("%q: the parser refuses it (%v); the test expects the parser to read time zones", spec, err)
		}
		if _, err := tryRenderChart(map[string]any{"reaper": map[string]any{"schedule": spec}}); err == nil {
			t.Errorf("%q: rendered; Kubernetes refuses a time zone in the schedule beside timeZone", spec)
		}
	}
	// The rendered CronJobs carry the schedule as given.
	os := renderChart(t, map[string]any{"reaper": map[string]any{"schedule": "@every 1h"}})
	for _, name := range []string{"idemd-reaper", "idemd-reaper-dry-run"} {
		o, ok := os.find("CronJob", name)
		if !ok {
			t.Fatalf("no CronJob %s", name)
		}
		if got := o.Obj.(interface{ GetName() string }).GetName(); got != name {
			t.Fatalf("CronJob %s decoded as %s", name, got)
		}
		if !strings.Contains(string(o.Doc), `schedule: "@every 1h"`) {
			t.Errorf("CronJob %s: schedule not rendered as given:\n%s", name, o.Doc)
		}
	}
}
