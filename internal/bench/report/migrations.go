package benchreport

import (
	"context"
	"fmt"
	"time"

	"github.com/idemd/idemd/internal/testing/e2e/load"
)

// Migrations runs the migrations benchmark (internal/testing/e2e/load,
// migrations.go): `idemctl migrate` on 10,000,000 keys (times the scale)
// while an API-shaped load runs at a fixed rate, on a private server, from
// the schema before 00012 and from the article's schema (the adoption,
// which builds an index CONCURRENTLY on the whole table).
func Migrations(ctx context.Context, adminURL string, scale Scale, logf func(string, ...any), rep *Report) error {
	for _, article := range []bool{false, true} {
		res, err := load.Migrations(ctx, adminURL, load.MigrationsOptions{Keys: scale.n(10_000_000), Article: article, Logf: logf})
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
	rep.Rows = append(rep.Rows, Row{Suite: "migrations", Name: fmt.Sprintf("seed: %s (%d unfinished), %s with indexes", on, res.Unfinished, res.TableSize),
		Value: Dur(res.Seed)})
	for _, s := range res.Steps {
		rep.Rows = append(rep.Rows, Row{Suite: "migrations", Name: "migration " + s.Name + ", " + on, Value: Dur(s.Duration)})
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
	rep.Rows = append(rep.Rows, Row{Suite: "migrations", Name: "API p99 and longest stall during vs before (" + on + ")",
		Ratio: Join(Ratio(float64(res.During.P99)/float64(max(res.Before.P99, 1)), "p99 before"),
			Ratio(float64(res.During.LongestStall)/float64(max(res.Before.LongestStall, 1)), "stall before"))})
	rep.Notes = append(rep.Notes, fmt.Sprintf("migrations: measured on %s. The database has %s, %d keys seeded (98 %% finished, 1.5 %% unfinished at started, ride_created or charge_created, 0.5 %% given up (unfinished on the article's schema); request_params about 200 bytes, response_body about 300), vacuumed. The API runs %d requests a second, each its key's insert and three phases in four transactions, the last staging a job; latency from the request's scheduled start, stall the longest gap between two commits. A migration's time is the one River's migrator and goose log.",
		res.Server, schema, res.Keys, res.Rate))
}
