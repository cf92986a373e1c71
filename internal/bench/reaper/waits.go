package reaperbench

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"
)

// waitsEvery is how often the inserts' wait events are sampled.
const waitsEvery = 20 * time.Millisecond

// Waits is what the API's inserts were doing on the server, sampled from
// pg_stat_activity every waitsEvery: for each insert in flight at a
// sample, its wait event ("type:event"), or "CPU" when it had none (it
// ran, or waited for something PostgreSQL does not instrument). Samples
// fall on an insert in proportion to how long it lasted, so the slow
// inserts, the tail, weigh most: this is where the inserts' time went,
// not what a typical insert waits for.
type Waits struct {
	Samples  int
	InFlight int
	By       map[string]int
}

// String is the four commonest waits as shares of the inserts in flight.
func (w Waits) String() string {
	if w.InFlight == 0 {
		return fmt.Sprintf("no insert in flight in %d samples", w.Samples)
	}
	keys := slices.Collect(maps.Keys(w.By))
	slices.SortFunc(keys, func(a, b string) int { return cmp.Or(cmp.Compare(w.By[b], w.By[a]), strings.Compare(a, b)) })
	parts := make([]string, 0, 4)
	for _, k := range keys[:min(4, len(keys))] {
		parts = append(parts, fmt.Sprintf("%s %.0f%%", k, 100*float64(w.By[k])/float64(w.InFlight)))
	}
	return fmt.Sprintf("%s (%d inserts in flight in %d samples)", strings.Join(parts, ", "), w.InFlight, w.Samples)
}

// sampleWaits samples the inserts' wait events until ctx ends. The
// workload's statement is recognised by its text; the sampler's own
// backend, whose query names that text too, is left out.
func (b *bench) sampleWaits(ctx context.Context) (Waits, error) {
	w := Waits{By: map[string]int{}}
	tick := time.NewTicker(waitsEvery)
	defer tick.Stop()
	for {
		rows, err := b.pool.Query(ctx, `
SELECT COALESCE(wait_event_type || ':' || wait_event, 'CPU'), count(*)::int
FROM pg_stat_activity
WHERE state = 'active' AND pid <> pg_backend_pid()
  AND query LIKE '%INSERT INTO idempotency_keys (idempotency_key, locked_at,%'
GROUP BY 1`)
		if err == nil {
			for rows.Next() {
				var k string
				var n int
				if err = rows.Scan(&k, &n); err != nil {
					break
				}
				w.By[k] += n
				w.InFlight += n
			}
			rows.Close()
			if err == nil {
				err = rows.Err()
			}
		}
		if err != nil {
			if ctx.Err() != nil {
				return w, nil
			}
			return w, fmt.Errorf("reaperbench: sample the inserts' waits: %w", err)
		}
		w.Samples++
		select {
		case <-ctx.Done():
			return w, nil
		case <-tick.C:
		}
	}
}
