package api

import (
	"context"
	"os"
	"strings"
	"testing"

	"github.com/idemd/idemd/internal/testing/dbtest"
)

// TestDocsTestRiders: the SQL docs/conformance.md gives for Rocket Rides'
// test riders creates riders who authenticate with the documented keys,
// and running it twice changes nothing.
func TestDocsTestRiders(t *testing.T) {
	doc, err := os.ReadFile("../../../docs/conformance.md")
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(doc), "### Test riders for Rocket Rides")
	if !ok {
		t.Fatal("docs/conformance.md has no section Test riders for Rocket Rides")
	}
	_, rest, ok = strings.Cut(rest, "```sql\n")
	sql, _, ok2 := strings.Cut(rest, "```")
	if !ok || !ok2 {
		t.Fatal("the section has no sql block")
	}
	ctx := context.Background()
	pool := dbtest.NewPool(t)
	if err := Migrate(ctx, dbtest.MigratorPool(t, pool)); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if _, err := pool.Exec(ctx, sql); err != nil {
			t.Fatalf("the documented SQL: %v\n%s", err, sql)
		}
	}
	for _, key := range []string{"sk_test_rider", "sk_test_other_rider"} {
		if u, err := userByAPIKey(ctx, pool, key); err != nil || u.Email == "" {
			t.Errorf("Bearer %s: %v", key, err)
		}
	}
	var n int
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM users").Scan(&n); err != nil || n != 2 {
		t.Errorf("%d users after running the SQL twice (%v), want 2", n, err)
	}
}
