package benchreport

import "context"

// Suites are the benchmark suites by name.
var Suites = map[string]func(ctx context.Context, adminURL string, scale Scale, logf func(string, ...any), rep *Report) error{
	"enqueuer":   Enqueuer,
	"reaper":     Reaper,
	"completer":  Completer,
	"e2e":        E2E,
	"staging":    Staging,
	"migrations": Migrations,
	"adoption":   Adoption,
	"standby":    ReaperStandby,
	"takeover":   Takeover,
}
