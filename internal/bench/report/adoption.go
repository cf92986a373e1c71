package benchreport

import (
	"context"
	"fmt"
	"strings"

	adoptionbench "github.com/idemd/idemd/internal/bench/adoption"
)

// Adoption runs the adoption suite (internal/bench/adoption): keys
// abandoned in the article's Ruby API (Sinatra + Sequel, SERIALIZABLE
// phases, 409 on a serialization failure) drained by the real completer
// at its defaults with --request-encoding form, against the same drain at
// --concurrency 1, each on a fresh database. It needs Debian's ruby,
// ruby-pg, ruby-sinatra and ruby-sequel (scripts/ensure-runtimes.sh).
func Adoption(ctx context.Context, adminURL string, scale Scale, logf func(string, ...any), rep *Report) error {
	res, err := adoptionbench.Run(ctx, adminURL, adoptionbench.Options{Keys: scale.n(90), Logf: logf})
	if err != nil {
		return fmt.Errorf("adoption suite: %w", err)
	}
	for _, d := range []adoptionbench.Drain{res.Serial, res.Defaults} {
		if err := d.Check(); err != nil {
			return fmt.Errorf("adoption suite: completer %s: %w", strings.Join(d.Args, " "), err)
		}
	}
	drain := func(d adoptionbench.Drain) string {
		return fmt.Sprintf("%s, %d replays %v; %d finished, 0 given up, 0 charged twice", Dur(d.Elapsed), d.Replays, d.Statuses, d.Finished)
	}
	name := fmt.Sprintf("drain %d keys abandoned in the article's Ruby API (SERIALIZABLE phases, form)", res.Keys)
	rep.Rows = append(rep.Rows,
		Row{Suite: "adoption", Name: name + ": completer " + strings.Join(adoptionbench.Serial, " ") + " (anchor)", Value: drain(res.Serial)},
		Row{Suite: "adoption", Name: name + ": completer defaults, " + strings.Join(adoptionbench.Defaults, " "), Value: drain(res.Defaults),
			Ratio:  Join(Ratio(res.TimeRatio(), "--concurrency 1 time"), Ratio(res.ReplayRatio(), "--concurrency 1 replays")),
			Target: Goal("time ≤ 2×, replays ≤ 1.5×", res.Met())},
	)
	return nil
}
