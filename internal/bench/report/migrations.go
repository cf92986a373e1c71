package benchreport

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/idemd/idemd/internal/testing/e2e/load"
)

// Migrations runs the migrations benchmark (internal/testing/e2e/load,
// migrations.go): `idemctl migrate` on 10,000,000 keys (times the scale)
// while an API-shaped load runs at a fixed rate, on a private server, from
// the schema before 00012 and from the article's schema (the adoption,
// which builds an index CONCURRENTLY on the whole table). River's and the
// staged jobs are 1,000,000 each (times the scale).
func Migrations(ctx context.Context, adminURL string, scale Scale, logf func(string, ...any), rep *Report) error {
	for _, article := range []bool{false, true} {
		res, err := load.Migrations(ctx, adminURL, load.MigrationsOptions{Keys: scale.n(10_000_000), Jobs: scale.n(1_000_000), Article: article, Logf: logf})
		if err != nil {
			return fmt.Errorf("migrations suite: %w", err)
		}
		migrationsRows(res, rep)
	}
	return nil
}

// migrationsRows appends one run's rows and note.
func migrationsRows(res *load.MigrationsReport, rep *Report) {
	on := fmt.Sprintf("%d keys", res.Keys)
	from, schema := fmt.Sprintf("from %05d", res.From), fmt.Sprintf("every River migration and idemd's up to %05d (with the completer's index of those releases)", res.From)
	if res.From == 0 {
		from, schema = "from the article's schema", "the article's idempotency_keys (JSONB response_body, its unique index only), users and staged_jobs, no River"
	}
	on += ", " + from
	rep.Rows = append(rep.Rows, Row{Suite: "migrations", Name: fmt.Sprintf("seed: %s (%d unfinished), %s with indexes; %d staged_jobs rows, %d river_job rows", on, res.Unfinished, res.TableSize, res.StagedJobs, res.RiverJobs),
		Value: Dur(res.Seed)})
	for _, s := range res.Steps {
		rep.Rows = append(rep.Rows, migrationStepRow(s, res.Before, on))
	}
	rep.Rows = append(rep.Rows, Row{Suite: "migrations", Name: fmt.Sprintf("idemctl migrate, %s, under %d requests/s", on, res.Rate),
		Value: fmt.Sprintf("%s, %d lock retries", Dur(res.Migrate), res.LockRetries)})
	for _, w := range []struct {
		name string
		w    load.APIWindow
	}{{"before the migration", res.Before}, {"during the migration", res.During}} {
		rep.Rows = append(rep.Rows, Row{Suite: "migrations", Name: fmt.Sprintf("API request (4 transactions) %s (%s), %d requests over %s", w.name, on, w.w.Requests, w.w.Length.Round(100*time.Millisecond)),
			Value: fmt.Sprintf("p50 %s, p99 %s, max %s; longest stall %s; %d errors", Dur(w.w.P50), Dur(w.w.P99), Dur(w.w.Max), Dur(w.w.LongestStall), w.w.Errors)})
	}
	if a := res.AnchorIndex; a.Requests > 0 {
		rep.Rows = append(rep.Rows, Row{Suite: "migrations", Name: fmt.Sprintf("anchor: the same created_at index built CONCURRENTLY by hand after the migration (%s), %d requests over %s", on, a.Requests, a.Length.Round(100*time.Millisecond)),
			Value: fmt.Sprintf("p50 %s, p99 %s, max %s; longest stall %s; %d errors", Dur(a.P50), Dur(a.P99), Dur(a.Max), Dur(a.LongestStall), a.Errors),
			Ratio: Ratio(float64(a.P99)/float64(max(res.Before.P99, 1)), "p99 before")})
	}
	p99Ratio := float64(res.During.P99) / float64(max(res.Before.P99, 1))
	rep.Rows = append(rep.Rows, Row{Suite: "migrations", Name: "API p99 and longest stall during vs before (" + on + ")",
		Ratio: Join(Ratio(p99Ratio, "p99 before"),
			Ratio(float64(res.During.LongestStall)/float64(max(res.Before.LongestStall, 1)), "stall before")),
		Target: Goal(stepGoal, res.During.LongestStall <= time.Second && p99Ratio <= 2)})
	rep.Notes = append(rep.Notes, fmt.Sprintf("migrations: measured on %s. The database has %s, %d keys seeded (98 %% finished, 1.5 %% unfinished at started, ride_created or charge_created, 0.5 %% given up (unfinished on the article's schema); request_params about 200 bytes, response_body about 300), %d staged_jobs rows never enqueued and %d river_job rows (95 %% completed, the newest 5 %% available; args about 100 bytes), vacuumed. The API runs %d requests a second, each its key's insert and three phases in four transactions, the last staging a job; latency from the request's scheduled start, stall the longest gap between two commits. A migration's time is the one River's migrator and goose log; its window ends at its log line's time (to the millisecond) and starts that time before, and its API figures are those of the requests overlapping the window (their count given: a short migration overlaps few) and of the longest gap between two commits overlapping it, its p99 against the p99 before the migration.",
		res.Server, schema, res.Keys, res.StagedJobs, res.RiverJobs, res.Rate))
	rep.Notes = append(rep.Notes, fmt.Sprintf("migrations (%s): locks, from pg_locks sampled every %s on a connection of its own from the window before the migration to its end (longest gap between two samples during the migration %s; a sample's query took %s on average). A lock held for less than the gap between two samples can be missed, and a sample within a millisecond of a migration's start or end may be given to its neighbour; held ≤ is the time between the samples around those that saw it, capped at the migration's window. Listed: the migrator's sessions' locks on tables, and on indexes and sequences those of SHARE UPDATE EXCLUSIVE or stronger (system catalogs and TOAST tables left out); locks on relations being created, not yet visible to other sessions, only counted. API lock waits: the locks the API's sessions awaited, and how many of those sessions a session of migrate's blocked (pg_blocking_pids); the NOTIFY commit lock is the one the API's notifying commits take in turn.",
		on, res.LockSampleInterval, Dur(res.LockSampleGap), Dur(res.LockSampleCost)))
	for _, s := range res.Steps {
		rep.Notes = append(rep.Notes, fmt.Sprintf("migrations (%s) %s: %s", on, s.Name, stepLocksText(s.Locks)))
	}
	rep.Notes = append(rep.Notes, fmt.Sprintf("migrations (%s) before the migration: %s", on, stepLocksText(res.BeforeLocks)))
	rep.Notes = append(rep.Notes, fmt.Sprintf("migrations (%s) outside the logged migrations (the advisory lock, the checks and grants every run makes, a retry's failed attempt): %s", on, stepLocksText(res.Outside)))
}

// stepGoal is the target for the API during each migration.
const stepGoal = "no stall > 1 s, p99 ≤ 2× before"

// migrationStepRow is one migration's row: its duration and the API's
// figures over its window, against the API's p99 before the migration.
func migrationStepRow(s load.MigrationStep, before load.APIWindow, on string) Row {
	api := fmt.Sprintf("API: no request overlapped it; longest stall %s", Dur(s.API.LongestStall))
	ratio := 0.0
	if n := s.API.Requests - s.API.Errors; n > 0 {
		ratio = float64(s.API.P99) / float64(max(before.P99, 1))
		api = fmt.Sprintf("API: %s overlapping, p99 %s, max %s; longest stall %s", plural(s.API.Requests, "request"), Dur(s.API.P99), Dur(s.API.Max), Dur(s.API.LongestStall))
	}
	if s.API.Errors > 0 {
		api += fmt.Sprintf("; %d errors", s.API.Errors)
	}
	row := Row{Suite: "migrations", Name: "migration " + s.Name + ", " + on, Value: Dur(s.Duration) + "; " + api,
		Target: Goal(stepGoal, s.API.LongestStall <= time.Second && ratio <= 2 && s.API.Errors == 0)}
	if ratio > 0 {
		row.Ratio = Ratio(ratio, "p99 before")
	}
	return row
}

// stepLocksText is what the lock sampler saw during a migration, e.g.
// "3 samples: ShareRowExclusiveLock on staged_jobs (held ≤ 6.1 ms; 2
// samples); API lock waits: none seen".
func stepLocksText(l load.StepLocks) string {
	if l.Samples == 0 {
		return "no sample fell in it"
	}
	var locks []string
	for _, h := range l.Held {
		what := "held"
		if !h.Granted {
			what = "awaited"
		}
		locks = append(locks, fmt.Sprintf("%s on %s (%s ≤ %s; %s)", h.Mode, h.Relation, what, Dur(h.AtMost), plural(h.Samples, "sample")))
	}
	if l.NewHeld > 0 {
		locks = append(locks, plural(l.NewHeld, "lock")+" on relations being created")
	}
	if len(locks) == 0 {
		locks = []string{"no relation lock seen"}
	}
	waits := "none seen"
	if l.APIWaited {
		waits = fmt.Sprintf("%s (%d behind migrate), the longest ≤ %s (%s)", plural(l.APIWaits.Sessions, "session"), l.APIWaits.BehindMigrator, Dur(l.APIWaits.AtMost), l.APIWaits.What)
	}
	return fmt.Sprintf("%s: %s; API lock waits: %s", plural(l.Samples, "sample"), strings.Join(locks, ", "), waits)
}

// plural is "1 sample", "2 samples".
func plural(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ss", n, noun)
}
