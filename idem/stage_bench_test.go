package idem_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/idemd/idemd/idem"
	"github.com/idemd/idemd/internal/testing/dbtest"
)

// BenchmarkStage compares staging a job as River's InsertTx would insert
// it (StageInsertTx: River's insert up to its final write, through
// riverdb's driver) with the anchor, StageJob's plain insert of the same
// row, one transaction per job on one database in one run: report
// StageInsertTx's ns/op as a ratio to the anchor's.
func BenchmarkStage(b *testing.B) {
	ctx := context.Background()
	pool := dbtest.NewPool(b)
	for _, c := range []struct {
		name  string
		stage func(pgx.Tx, int) error
	}{
		{"StageJob (anchor)", func(tx pgx.Tx, n int) error {
			_, err := idem.StageJob(ctx, tx, "plain", plainArgs{N: n}, nil)
			return err
		}},
		{"StageInsertTx", func(tx pgx.Tx, n int) error {
			_, err := idem.StageInsertTx(ctx, tx, plainArgs{N: n}, nil)
			return err
		}},
		{"StageInsertTx unique", func(tx pgx.Tx, n int) error {
			_, err := idem.StageInsertTx(ctx, tx, invoiceArgs{CustomerID: n, Month: "2026-12"}, nil)
			return err
		}},
	} {
		b.Run(c.name, func(b *testing.B) {
			for i := range b.N {
				if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return c.stage(tx, i) }); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
