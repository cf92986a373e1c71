package completerbench

import (
	"context"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemd/idemd/internal/migrate"
	"github.com/idemd/idemd/internal/testing/dbtest"
)

func sqlVariant(name string, stmts ...string) HotVariant {
	return HotVariant{Name: name, Setup: func(ctx context.Context, pool *pgxpool.Pool) error {
		if _, err := migrate.Up(ctx, pool, migrate.Options{}); err != nil {
			return err
		}
		for _, s := range stmts {
			if _, err := pool.Exec(ctx, s); err != nil {
				return err
			}
		}
		return nil
	}}
}

const (
	// The partial index 00002 creates and 00012 drops: what the trigger
	// and idemd_unfinished_keys are measured against.
	expPartial   = `CREATE INDEX IF NOT EXISTS idempotency_keys_unfinished ON idempotency_keys (created_at) WHERE recovery_point <> 'finished' AND completer_gave_up_at IS NULL`
	expNoTrigger = `DROP TRIGGER IF EXISTS idemd_track_unfinished_key ON idempotency_keys`
	// A trigger that also deletes the key's row when the API finishes it,
	// so the table holds exactly the unfinished keys (no prune), at the
	// price of a read in the API's last phase.
	expDeleteTrigger = `
CREATE OR REPLACE FUNCTION exp_untrack() RETURNS trigger LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
BEGIN
    DELETE FROM idemd_unfinished_keys WHERE created_at = NEW.created_at AND key_id = NEW.id;
    RETURN NULL;
END $$;
CREATE TRIGGER exp_untrack AFTER UPDATE OF recovery_point ON idempotency_keys FOR EACH ROW
WHEN (NEW.recovery_point = 'finished' AND OLD.recovery_point <> 'finished') EXECUTE FUNCTION exp_untrack();`
	expFF90 = `ALTER TABLE idempotency_keys SET (fillfactor = 90)`
)

// TestHotAlternatives measures the schema alternatives of issue 22 with the
// key workload. IDEMD_HOT_ALTERNATIVES=<seconds per round> runs it.
func TestHotAlternatives(t *testing.T) {
	secs, _ := strconv.Atoi(os.Getenv("IDEMD_HOT_ALTERNATIVES"))
	if secs <= 0 {
		t.Skip("set IDEMD_HOT_ALTERNATIVES=<seconds per round> to measure the alternatives")
	}
	variants := []HotVariant{
		ArticleVariant,
		IdemdVariant, // idemd_unfinished_keys, insert-only trigger, fillfactor 90
		sqlVariant("former partial index", expNoTrigger, expPartial, `ALTER TABLE idempotency_keys RESET (fillfactor)`),
		sqlVariant("created_at index only", expNoTrigger, `ALTER TABLE idempotency_keys RESET (fillfactor)`),
		sqlVariant("insert+delete triggers", expDeleteTrigger, `ALTER TABLE idempotency_keys RESET (fillfactor)`),
		sqlVariant("idemd, default fillfactor", `ALTER TABLE idempotency_keys RESET (fillfactor)`),
		sqlVariant("article's indexes, fillfactor 90", expNoTrigger, `DROP INDEX idempotency_keys_created_at`, expFF90),
	}
	if os.Getenv("IDEMD_HOT_VARIANTS") == "short" {
		variants = variants[:2]
	}
	users, _ := strconv.Atoi(os.Getenv("IDEMD_HOT_USERS"))
	clients, _ := strconv.Atoi(os.Getenv("IDEMD_HOT_CLIENTS"))
	rep, err := RunHot(context.Background(), dbtest.ServerURL(t), HotOptions{
		Duration: time.Duration(secs) * time.Second, Variants: variants, Users: users, Clients: clients, Logf: t.Logf,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Log("\n" + rep.String())
}
