package migrate_test

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"sync"
	"testing"

	"github.com/idemd/idemd/internal/migrate"
	"github.com/idemd/idemd/internal/testing/dbtest"
	"github.com/idemd/idemd/internal/testing/pgbouncertest"
	"github.com/idemd/idemd/internal/testing/testbin"
)

// TestConcurrentMigrateThroughTransactionPooler: three `idemctl migrate`
// processes at once through a real PgBouncer in transaction mode, as the
// migrator role of deploy/sql/roles.sql, other
// clients on the pool, on an empty database: all succeed, the schema is
// complete, and no server connection keeps the migration lock or any other
// session state.
func TestConcurrentMigrateThroughTransactionPooler(t *testing.T) {
	bin := testbin.Build(t, "github.com/idemd/idemd/cmd/idemctl")
	pool := emptyDatabase(t)
	ctx := context.Background()
	db := pool.Config().ConnConfig.Database
	b := pgbouncertest.Start(t, pgbouncertest.Options{PoolSize: 6, Users: []string{dbtest.MigratorRole}})
	loadCtx, stopLoad := context.WithCancel(ctx)
	waitLoad, loadTx := b.Load(loadCtx, db, "postgres", 2)

	var wg sync.WaitGroup
	outs := make([]bytes.Buffer, 3)
	errs := make([]error, 3)
	for i := range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cmd := exec.Command(bin, "migrate", "--pooler", "transaction", "--log-format", "console")
			cmd.Env = append(os.Environ(), "DATABASE_URL="+b.URL(db, dbtest.MigratorRole))
			cmd.Stdout, cmd.Stderr = &outs[i], &outs[i]
			errs[i] = cmd.Run()
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("migrator %d: %v\n%s", i, err, outs[i].String())
		}
	}
	if err := migrate.Check(ctx, pool); err != nil {
		t.Fatalf("after three concurrent migrations: %v", err)
	}

	stopLoad()
	if err := waitLoad(); err != nil {
		t.Fatal(err)
	}
	if loadTx.Load() == 0 {
		t.Fatal("no other client used the pool")
	}
	locks, err := dbtest.AdvisoryLocks(ctx, pool)
	if err != nil {
		t.Fatal(err)
	}
	if locks != 0 {
		t.Fatalf("%d advisory locks held after the migrations", locks)
	}
	leaks, err := b.Leaks(ctx, db, dbtest.MigratorRole, "application_name")
	if err != nil {
		t.Fatal(err)
	}
	if len(leaks) > 0 {
		t.Fatalf("server connections were left with session state: %q", leaks)
	}
}
