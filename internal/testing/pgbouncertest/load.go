package pgbouncertest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
)

// LoadTable is the scratch table Load's clients write to: one row per
// client, updated in place, so a long load does not grow it.
const LoadTable = "pgbouncertest_load"

// Load runs clients goroutines that share the pool with the code under test:
// each has its own client connection through pgbouncer and runs small
// transactions (BEGIN; SELECT pg_backend_pid(), now(); an upsert into
// LoadTable; COMMIT) in a loop until ctx ends or the test ends. In
// transaction mode that moves the server connections between clients all
// the time, which is what the code under test must tolerate.
//
// wait blocks until every client has stopped and returns the first error
// other than the end of ctx; transactions counts the committed
// transactions, so a test can assert that the load really ran.
func (b *Bouncer) Load(ctx context.Context, database, user string, clients int) (wait func() error, transactions *atomic.Int64) {
	transactions = &atomic.Int64{}
	// The test's end stops the load too: no goroutine outlives the test,
	// and none is still connected when pgbouncer is stopped.
	ctx, cancel := context.WithCancel(ctx)
	stopWithTest := context.AfterFunc(b.stopCtx, cancel)

	var (
		wg       sync.WaitGroup
		errMu    sync.Mutex
		firstErr error
	)
	fail := func(err error) {
		errMu.Lock()
		if firstErr == nil {
			firstErr = err
		}
		errMu.Unlock()
	}
	b.loads.Add(1)
	wg.Add(1)
	go func() {
		defer b.loads.Done()
		defer wg.Done()
		// Created once, before the clients start: concurrent CREATE TABLE
		// IF NOT EXISTS can still collide on the catalog.
		if err := b.createLoadTable(ctx, database, user); err != nil {
			if ctx.Err() == nil {
				fail(err)
			}
			return
		}
		var clientsWG sync.WaitGroup
		for i := range clients {
			clientsWG.Add(1)
			go func() {
				defer clientsWG.Done()
				if err := b.loadClient(ctx, database, user, i, transactions); err != nil && ctx.Err() == nil {
					fail(fmt.Errorf("load client %d: %w", i, err))
				}
			}()
		}
		clientsWG.Wait()
	}()
	wait = func() error {
		wg.Wait()
		stopWithTest()
		cancel()
		errMu.Lock()
		defer errMu.Unlock()
		return firstErr
	}
	return wait, transactions
}

func (b *Bouncer) createLoadTable(ctx context.Context, database, user string) error {
	conn, err := connect(ctx, b.URL(database, user))
	if err != nil {
		return fmt.Errorf("load: create table: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	_, err = conn.Exec(ctx, `CREATE TABLE IF NOT EXISTS `+LoadTable+` (
		client int PRIMARY KEY,
		transactions bigint NOT NULL,
		last_backend int NOT NULL,
		last_at timestamptz NOT NULL)`)
	if err != nil {
		return fmt.Errorf("load: create table: %w", err)
	}
	return nil
}

func (b *Bouncer) loadClient(ctx context.Context, database, user string, client int, transactions *atomic.Int64) error {
	conn, err := connect(ctx, b.URL(database, user))
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	for ctx.Err() == nil {
		err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
			var pid int
			var at time.Time
			if err := tx.QueryRow(ctx, "SELECT pg_backend_pid(), now()").Scan(&pid, &at); err != nil {
				return fmt.Errorf("select: %w", err)
			}
			_, err := tx.Exec(ctx, `INSERT INTO `+LoadTable+` (client, transactions, last_backend, last_at) VALUES ($1, 1, $2, $3)
				ON CONFLICT (client) DO UPDATE SET transactions = `+LoadTable+`.transactions + 1,
					last_backend = excluded.last_backend, last_at = excluded.last_at`, client, pid, at)
			if err != nil {
				return fmt.Errorf("upsert: %w", err)
			}
			return nil
		})
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, context.Canceled) {
				return nil
			}
			return err
		}
		transactions.Add(1)
	}
	return nil
}
