package api_test

import (
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"

	"github.com/idemd/idemd/examples/rocketrides/api"
	"github.com/idemd/idemd/examples/rocketrides/receipts"
	"github.com/idemd/idemd/idem"
)

// TestReceiptJobModes: the receipt job is staged (default), inserted into
// River in the phase's transaction, or not created, and exactly once per
// paid ride either way; at either isolation level.
func TestReceiptJobModes(t *testing.T) {
	for _, tc := range []struct {
		mode          api.ReceiptJobs
		iso           idem.Isolation
		staged, river int
	}{
		{"", idem.ReadCommitted, 1, 0},
		{api.ReceiptJobsStaged, idem.Serializable, 1, 0},
		{api.ReceiptJobsRiver, idem.ReadCommitted, 0, 1},
		{api.ReceiptJobsRiver, idem.Serializable, 0, 1},
		{api.ReceiptJobsNone, idem.ReadCommitted, 0, 0},
	} {
		t.Run(string(tc.mode)+"/"+tc.iso.String(), func(t *testing.T) {
			f := newFixtureWith(t, func(c *api.Config) {
				c.ReceiptJobs, c.Isolation = tc.mode, tc.iso
				if tc.mode == api.ReceiptJobsRiver {
					// An insert-only client, as the server makes without
					// its worker.
					rc, err := river.NewClient[pgx.Tx](riverpgxv5.New(c.Pool), &river.Config{})
					if err != nil {
						t.Fatal(err)
					}
					c.River = rc
				}
			})
			key := newKey()
			assertCreated(t, f.post(key, validParams))
			assertCreated(t, f.post(key, validParams)) // the replay makes no second job
			staged := f.count(`SELECT count(*) FROM staged_jobs WHERE job_name = $1`, receipts.Kind)
			jobs := f.count(`SELECT count(*) FROM river_job WHERE kind = $1`, receipts.Kind)
			if staged != tc.staged || jobs != tc.river {
				t.Fatalf("staged %d, River jobs %d; want %d, %d", staged, jobs, tc.staged, tc.river)
			}
		})
	}
}

func TestReceiptJobsRiverNeedsClient(t *testing.T) {
	_, err := api.New(api.Config{Pool: nil, StripeURL: "http://x", StripeKey: "k", ReceiptJobs: api.ReceiptJobsRiver})
	if err == nil {
		t.Fatal("ReceiptJobs river without River accepted")
	}
}
