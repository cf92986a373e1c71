package soak

import (
	"fmt"
	"slices"
	"strings"
	"time"
)

// The flatness targets (issue 47), for a 30-minute soak; shorter runs
// scale the minute marks (mark).
const (
	// HorizonLimit: the xmin horizon's age, in seconds' worth of the
	// database's transactions, at every sample.
	HorizonLimit = 10.0
	// KeysGrowthLimit: idempotency_keys' total size at the end over its
	// size once steady (minute 8).
	KeysGrowthLimit = 1.5
	// DeadLimit: idempotency_keys' dead tuples over its live ones at the
	// end: the lowest of the last 5 minutes' samples (see deadCheck).
	DeadLimit = 0.20
	// ThroughputFloor: the API's throughput in the last 5 minutes over
	// minutes 3-8.
	ThroughputFloor = 0.9
	// RSSGrowth and RSSSlack: a daemon's RSS at the end may be at most
	// RSSGrowth times its RSS at minute 3 plus RSSSlack.
	RSSGrowth = 1.5
	RSSSlack  = 20 << 20
)

// Check is one check of the soak with its measured value.
type Check struct {
	Name   string
	Value  string
	Target string
	Pass   bool
}

func (c Check) String() string {
	verdict := "PASS"
	if !c.Pass {
		verdict = "FAIL"
	}
	return fmt.Sprintf("%s  %s: %s (target: %s)", verdict, c.Name, c.Value, c.Target)
}

// mark is minute m of a 30-minute soak, scaled to a soak of d.
func mark(d time.Duration, m float64) time.Duration {
	return time.Duration(float64(d) * m / 30)
}

// at is the first sample taken at or after t (the last one when none is).
func at(samples []Sample, t time.Duration) Sample {
	for _, s := range samples {
		if s.At >= t {
			return s
		}
	}
	return samples[len(samples)-1]
}

// Flatness evaluates the flatness checks over the samples of a soak of
// duration d: steady is when idempotency_keys' size is steady (minute 8 of
// 30), daemons the idemd processes whose memory is checked.
func Flatness(samples []Sample, d, steady time.Duration, daemons []string) []Check {
	if len(samples) < 2 {
		return []Check{{Name: "samples", Value: fmt.Sprintf("%d", len(samples)), Target: "at least 2"}}
	}
	first, last := samples[0], samples[len(samples)-1]
	var checks []Check
	checks = append(checks, horizonCheck(samples))
	for _, t := range Tables {
		n := last.Tables[t].Autovacuums - first.Tables[t].Autovacuums
		checks = append(checks, Check{
			Name:   "autovacuum on " + t,
			Value:  fmt.Sprintf("%d runs during the soak (%d analyzes)", n, last.Tables[t].Autoanalyzes-first.Tables[t].Autoanalyzes),
			Target: "at least 1",
			Pass:   n >= 1,
		})
	}
	m8 := at(samples, steady)
	keys8, keysEnd := m8.Tables["idempotency_keys"], last.Tables["idempotency_keys"]
	checks = append(checks, Check{
		Name: "idempotency_keys size",
		Value: fmt.Sprintf("%s at the end, %s at %s (%.2f×); heap %s and %s",
			mb(keysEnd.Total), mb(keys8.Total), m8.At.Round(time.Second), ratio(keysEnd.Total, keys8.Total), mb(keysEnd.Heap), mb(keys8.Heap)),
		Target: fmt.Sprintf("≤ %.1f× its size at minute 8 (%s)", KeysGrowthLimit, steady.Round(time.Second)),
		Pass:   float64(keysEnd.Total) <= KeysGrowthLimit*float64(keys8.Total),
	})
	checks = append(checks, deadCheck(samples, d))
	early := rate(samples, mark(d, 3), mark(d, 8))
	late := rate(samples, d-mark(d, 5), d)
	checks = append(checks, Check{
		Name:   "API throughput",
		Value:  fmt.Sprintf("%.1f responses/s in the last %s, %.1f in %s-%s (%.2f×)", late, mark(d, 5).Round(time.Second), early, mark(d, 3).Round(time.Second), mark(d, 8).Round(time.Second), late/max(early, 1e-9)),
		Target: fmt.Sprintf("≥ %.1f× minutes 3-8", ThroughputFloor),
		Pass:   early > 0 && late >= ThroughputFloor*early,
	})
	m3 := at(samples, mark(d, 3))
	for _, name := range daemons {
		r3, rEnd := m3.Procs[name].RSS, last.Procs[name].RSS
		limit := RSSGrowth*float64(r3) + RSSSlack
		checks = append(checks, Check{
			Name:   "RSS of " + name,
			Value:  fmt.Sprintf("%s at the end, %s at %s; goroutines %d and %d", mb(rEnd), mb(r3), m3.At.Round(time.Second), last.Procs[name].Goroutines, m3.Procs[name].Goroutines),
			Target: fmt.Sprintf("≤ %.1f× minute 3 + %s (%s)", RSSGrowth, mb(RSSSlack), mb(int64(limit))),
			Pass:   r3 > 0 && rEnd > 0 && float64(rEnd) <= limit,
		})
	}
	checks = append(checks, connectionsCheck(samples, d))
	return checks
}

// horizonCheck: at every sample with a transaction rate, the horizon's age
// in seconds' worth of transactions is under HorizonLimit. A sample whose
// oldest xmin is the API's is left out and counted: the target is about
// what idemd and the server do while the API holds no snapshot.
func horizonCheck(samples []Sample) Check {
	var worst Sample
	worstSecs, judged, api := -1.0, 0, 0
	for _, s := range samples {
		if s.XIDRate <= 0 {
			continue
		}
		if s.Horizon.Holder == apiAppName && s.Horizon.Seconds(s.XIDRate) >= HorizonLimit {
			api++
			continue
		}
		judged++
		if secs := s.Horizon.Seconds(s.XIDRate); secs > worstSecs {
			worst, worstSecs = s, secs
		}
	}
	c := Check{Name: "xmin horizon age", Target: fmt.Sprintf("< %.0f s of transactions at every sample", HorizonLimit)}
	if judged == 0 {
		c.Value = "no sample with a transaction rate"
		return c
	}
	c.Value = fmt.Sprintf("at most %.1f s (%d transactions at %.0f/s, held by %s for %s, at %s) over %d samples",
		worstSecs, worst.Horizon.Age, worst.XIDRate, orNone(worst.Horizon.Holder), worst.Horizon.HeldFor.Round(time.Second), worst.At.Round(time.Second), judged)
	if api > 0 {
		c.Value += fmt.Sprintf("; %d samples left out, the API's own snapshot being the oldest", api)
	}
	c.Pass = worstSecs < HorizonLimit
	return c
}

// deadCheck: idempotency_keys' dead tuples at most DeadLimit of its live
// ones after the last autovacuum of the soak's last 5 minutes (at least
// deadWindow), read as the lowest ratio of those minutes' samples. At PostgreSQL's defaults
// autovacuum lets dead tuples reach 20 % of the table (its scale factor)
// plus what a naptime adds before it runs, so a table vacuum keeps clean
// goes up and down a sawtooth whose peak passes 20 %, and a single sample
// at the end lands anywhere on it; what the lowest point says is whether
// vacuum still removes them. A pinned horizon keeps them all, and the
// lowest point stays high.
func deadCheck(samples []Sample, d time.Duration) Check {
	window := max(mark(d, 5), deadWindow)
	from := d - window
	low, high := -1.0, 0.0
	var lowAt Sample
	for _, s := range samples {
		if s.At < from {
			continue
		}
		k := s.Tables["idempotency_keys"]
		r := ratio(k.Dead, k.Live)
		if low < 0 || r < low {
			low, lowAt = r, s
		}
		high = max(high, r)
	}
	end := samples[len(samples)-1].Tables["idempotency_keys"]
	k := lowAt.Tables["idempotency_keys"]
	return Check{
		Name: "idempotency_keys dead tuples",
		Value: fmt.Sprintf("lowest in the last %s %.1f %% (%d dead, %d live, at %s), highest %.1f %%, at the end %.1f %% (%d dead, %d live)",
			window.Round(time.Second), 100*low, k.Dead, k.Live, lowAt.At.Round(time.Second), 100*high, 100*ratio(end.Dead, end.Live), end.Dead, end.Live),
		Target: fmt.Sprintf("≤ %.0f %% of live after autovacuum", 100*DeadLimit),
		Pass:   low >= 0 && low <= DeadLimit,
	}
}

// deadWindow is the shortest window deadCheck looks at: two of
// autovacuum's default naptimes, so that it holds a vacuum however short
// the soak.
const deadWindow = 2 * time.Minute

// connectionsCheck: no application_name has more client sessions in the
// last third of the soak than at its most before; the pools have reached
// their size by then, so growth is a leak.
func connectionsCheck(samples []Sample, d time.Duration) Check {
	cut := d * 2 / 3
	before, after := map[string]int{}, map[string]int{}
	for _, s := range samples {
		m := before
		if s.At > cut {
			m = after
		}
		total := 0
		for app, n := range s.Conns {
			m[app] = max(m[app], n)
			total += n
		}
		m["total"] = max(m["total"], total)
	}
	var grew, parts []string
	for _, app := range append(slices.Clone(AppNames), otherApps) {
		parts = append(parts, fmt.Sprintf("%s %d→%d", app, before[app], after[app]))
		if after[app] > before[app] {
			grew = append(grew, app)
		}
	}
	// The total is shown, not judged: its peak depends on whether every
	// pool peaks at one sample.
	parts = append(parts, fmt.Sprintf("total %d→%d", before["total"], after["total"]))
	c := Check{
		Name:   "connections",
		Value:  "most sessions before and in the last third: " + strings.Join(parts, ", "),
		Target: "none more in the last third than before",
		Pass:   len(grew) == 0 && len(after) > 0,
	}
	if len(grew) > 0 {
		c.Value += "; grew: " + strings.Join(grew, ", ")
	}
	return c
}

// rate is the API's responses per second between the samples at from and
// to.
func rate(samples []Sample, from, to time.Duration) float64 {
	a, b := at(samples, from), at(samples, to)
	dt := (b.At - a.At).Seconds()
	if dt <= 0 {
		return 0
	}
	return (b.APIResponses - a.APIResponses) / dt
}

func ratio(a, b int64) float64 {
	if b == 0 {
		return 0
	}
	return float64(a) / float64(b)
}

func mb(b int64) string { return fmt.Sprintf("%.1f MB", float64(b)/(1<<20)) }

func orNone(s string) string {
	if s == "" {
		return "none"
	}
	return s
}
