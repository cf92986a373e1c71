package operator

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemd/idemd/internal/riverdb"
	"github.com/idemd/idemd/internal/testing/dbtest"
)

func TestMain(m *testing.M) { dbtest.Main(m) }

// TestRiverJobLookupUsesMetadataIndex: the lookups of a key's or a staged
// id's River jobs (metadata containment) can use River's GIN index on
// river_job.metadata rather than reading the whole table. Sequential scans
// are priced out because the test table is tiny.
func TestRiverJobLookupUsesMetadataIndex(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, dbtest.NewDatabase(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck
	if _, err := tx.Exec(ctx, "SET LOCAL enable_seqscan = off"); err != nil {
		t.Fatal(err)
	}
	rows, err := tx.Query(ctx, "EXPLAIN "+riverdb.JobsByMetadataSQL, `{"idemd_key_id": 1}`)
	if err != nil {
		t.Fatal(err)
	}
	var plan strings.Builder
	for rows.Next() {
		var line string
		if err := rows.Scan(&line); err != nil {
			t.Fatal(err)
		}
		plan.WriteString(line + "\n")
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(plan.String(), "river_job_metadata_index") {
		t.Fatalf("plan does not use river_job_metadata_index:\n%s", plan.String())
	}
}
