package receipts_test

import (
	"context"
	"testing"

	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"

	"github.com/idemd/idemd/examples/rocketrides/api"
	"github.com/idemd/idemd/examples/rocketrides/receipts"
	"github.com/idemd/idemd/internal/testing/dbtest"
)

func TestMain(m *testing.M) { dbtest.Main(m) }

func TestWorkRecordsOneReceiptPerJob(t *testing.T) {
	pool := dbtest.NewPool(t)
	ctx := context.Background()
	// Rocket Rides' tables as the migrator (the application's migration
	// in production), so roles.sql's default privileges grant them to the
	// runtime role the test's pool uses.
	if err := api.Migrate(ctx, dbtest.MigratorPool(t, pool)); err != nil {
		t.Fatal(err)
	}
	uid, err := api.CreateUser(ctx, pool, "rider@example.com", "cus_r", "sk_rider_0123456789")
	if err != nil {
		t.Fatal(err)
	}
	w := &receipts.Worker{Pool: pool}
	job := &river.Job[receipts.Args]{JobRow: &rivertype.JobRow{ID: 42}, Args: receipts.Args{Amount: 2000, Currency: "usd", UserID: uid, RideID: 7}}
	for range 2 { // River is at-least-once: a rerun must not send twice
		if err := w.Work(ctx, job); err != nil {
			t.Fatal(err)
		}
	}
	var n int
	var email string
	if err := pool.QueryRow(ctx, `SELECT count(*), min(email) FROM ride_receipts WHERE ride_id = 7`).Scan(&n, &email); err != nil || n != 1 || email != "rider@example.com" {
		t.Fatalf("%d receipts to %q (%v)", n, email, err)
	}
	missing := &river.Job[receipts.Args]{JobRow: &rivertype.JobRow{ID: 43}, Args: receipts.Args{UserID: 999999}}
	if err := w.Work(ctx, missing); err == nil {
		t.Fatal("unknown user must cancel the job")
	}
	if (receipts.Args{}).Kind() != "send_ride_receipt" {
		t.Fatal("kind")
	}
}
