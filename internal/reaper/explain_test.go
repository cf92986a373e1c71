package reaper

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemd/idemd/internal/testing/dbtest"
)

// planNode is a node of EXPLAIN (FORMAT JSON)'s plan tree.
type planNode struct {
	NodeType     string     `json:"Node Type"`
	IndexName    string     `json:"Index Name"`
	RelationName string     `json:"Relation Name"`
	SubplanName  string     `json:"Subplan Name"`
	Plans        []planNode `json:"Plans"`
}

// walk calls fn on n and every node below it.
func (n *planNode) walk(fn func(*planNode)) {
	fn(n)
	for i := range n.Plans {
		n.Plans[i].walk(fn)
	}
}

// subplan is the part of the plan computing the CTE or subquery name
// ("CTE bound").
func (n *planNode) subplan(t *testing.T, name string) *planNode {
	t.Helper()
	var found *planNode
	n.walk(func(p *planNode) {
		if p.SubplanName == name && found == nil {
			found = p
		}
	})
	if found == nil {
		t.Fatalf("no %q in the plan:\n%s", name, n)
	}
	return found
}

// has reports whether a node below n (n included) is of type nodeType on
// index (any index when empty).
func (n *planNode) has(nodeType, index string) bool {
	found := false
	n.walk(func(p *planNode) {
		if p.NodeType == nodeType && (index == "" || p.IndexName == index) {
			found = true
		}
	})
	return found
}

// String is an indented outline, for failure messages.
func (n *planNode) String() string {
	var b strings.Builder
	var write func(p *planNode, depth int)
	write = func(p *planNode, depth int) {
		fmt.Fprintf(&b, "%s%s", strings.Repeat("  ", depth), p.NodeType)
		if p.IndexName != "" {
			fmt.Fprintf(&b, " using %s", p.IndexName)
		} else if p.RelationName != "" {
			fmt.Fprintf(&b, " on %s", p.RelationName)
		}
		if p.SubplanName != "" {
			fmt.Fprintf(&b, " (%s)", p.SubplanName)
		}
		b.WriteString("\n")
		for i := range p.Plans {
			write(&p.Plans[i], depth+1)
		}
	}
	write(n, 0)
	return b.String()
}

// TestPlansTheCommentsPromise checks, with EXPLAIN on a real table of
// 100k keys (half past retention, vacuumed and analysed), the plans sql.go's
// comments promise:
//   - a range batch's bound is an index-only scan of the created_at index,
//     with no sort;
//   - every form finds its keys by walking the created_at index from the
//     cursor (never a sequential scan of the table);
//   - the snapshot of a key to review is a primary-key probe per key;
//   - the plan (dry run, caps, idemctl status) walks the created_at index.
func TestPlansTheCommentsPromise(t *testing.T) {
	pool := dbtest.NewPool(t)
	ctx := context.Background()
	const keys = 100_000
	if _, err := pool.Exec(ctx, `
INSERT INTO idempotency_keys (created_at, idempotency_key, locked_at, request_method, request_params, request_path, recovery_point, user_id)
SELECT now() - interval '144 hours' + g * (interval '144 hours' / $1), 'k-' || g, NULL, 'POST', '{}', '/rides',
       CASE WHEN g % 100 = 0 THEN 'started' ELSE 'finished' END, g % 1000
FROM generate_series(1, $1::int) g`, keys); err != nil {
		t.Fatal(err)
	}
	// The visibility map (an index-only scan needs it to skip the heap)
	// and the statistics, as autovacuum keeps them on a live table.
	if _, err := dbtest.AdminPool(t, pool).Exec(ctx, "VACUUM ANALYZE idempotency_keys"); err != nil {
		t.Fatal(err)
	}
	svc := newService(t, pool, nil)
	explain := func(t *testing.T, sql string, args pgx.NamedArgs) *planNode {
		t.Helper()
		var raw []byte
		if err := pool.QueryRow(ctx, "EXPLAIN (FORMAT JSON) "+sql, args).Scan(&raw); err != nil {
			t.Fatal(err)
		}
		var out []struct{ Plan planNode }
		if err := json.Unmarshal(raw, &out); err != nil || len(out) != 1 {
			t.Fatalf("EXPLAIN output %s: %v", raw, err)
		}
		return &out[0].Plan
	}
	const createdAt, pkey = "idempotency_keys_created_at", "idempotency_keys_pkey"
	walksCreatedAt := func(t *testing.T, p *planNode, what string) {
		t.Helper()
		if !p.has("Index Scan", createdAt) && !p.has("Index Only Scan", createdAt) && !p.has("Bitmap Index Scan", createdAt) {
			t.Errorf("%s does not walk %s:\n%s", what, createdAt, p)
		}
		if p.has("Seq Scan", "") {
			t.Errorf("%s scans a table sequentially:\n%s", what, p)
		}
	}
	snapshotIsAPrimaryKeyProbe := func(t *testing.T, p *planNode) {
		t.Helper()
		if n := p.subplan(t, "CTE needs_review"); !n.has("Index Scan", pkey) || n.has("Seq Scan", "") {
			t.Errorf("the snapshot of a key to review is not a probe of %s:\n%s", pkey, n)
		}
	}

	cursor := &batchCursor{createdAt: time.Now().Add(-100 * time.Hour), id: keys / 4}
	for _, c := range []struct {
		name   string
		cursor *batchCursor
	}{{"first batch", nil}, {"from a cursor", cursor}} {
		job := batchJob{batchSize: DefaultSettings().BatchSize, cursor: c.cursor}
		args := svc.batchArgs(job)
		t.Run("range form, "+c.name, func(t *testing.T) {
			p := explain(t, rangeBatchSQL, args)
			bound := p.subplan(t, "CTE bound")
			if !bound.has("Index Only Scan", createdAt) || bound.has("Sort", "") || bound.has("Incremental Sort", "") {
				t.Errorf("the bound is not an index-only scan of %s without a sort:\n%s", createdAt, bound)
			}
			walksCreatedAt(t, bound, "the bound")
			walksCreatedAt(t, p.subplan(t, "CTE deleted"), "the DELETE")
			snapshotIsAPrimaryKeyProbe(t, p)
		})
		t.Run("ordered form, "+c.name, func(t *testing.T) {
			p := explain(t, orderedBatchSQL, args)
			walksCreatedAt(t, p.subplan(t, "CTE bound"), "the bound")
			walksCreatedAt(t, p.subplan(t, "CTE deleted"), "the DELETE")
			snapshotIsAPrimaryKeyProbe(t, p)
		})
		t.Run("locking form, "+c.name, func(t *testing.T) {
			p := explain(t, lockingBatchSQL, args)
			walksCreatedAt(t, p.subplan(t, "CTE batch"), "the pick of the keys to lock")
			snapshotIsAPrimaryKeyProbe(t, p)
		})
	}
	t.Run("plan", func(t *testing.T) {
		args := eligibilityArgs(svc.cfg.Eligibility, nil)
		args["limit"] = nil
		walksCreatedAt(t, explain(t, planSQL, args).subplan(t, "CTE eligible"), "the count of eligible keys")
	})
}
