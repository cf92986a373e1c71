package api

import (
	"context"
	_ "embed"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

//go:embed schema.sql
var schemaSQL string

// migrateLockKey serialises concurrent Migrate calls ("rrmigrat").
const migrateLockKey int64 = 0x72726d6967726174

// Migrate applies Rocket Rides' tables. idemd's migrations must already be
// applied (rides references idempotency_keys). Safe to run repeatedly and
// concurrently.
func Migrate(ctx context.Context, pool *pgxpool.Pool) error {
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, migrateLockKey); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, schemaSQL)
		return err
	})
	if err != nil {
		return fmt.Errorf("rocketrides: migrate: %w", err)
	}
	return nil
}
