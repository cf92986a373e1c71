package completerbench

import (
	"context"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"idemd/internal/dbtest"
	"idemd/internal/migrate"
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
	expPartial   = `CREATE INDEX IF NOT EXISTS idempotency_keys_unfinished ON idempotency_keys (created_at) WHERE recovery_point <> 'finished' AND completer_gave_up_at IS NULL`
	expNoPartial = `DROP INDEX IF EXISTS idempotency_keys_unfinished`
	expSide      = `
CREATE TABLE IF NOT EXISTS exp_unfinished (key_id BIGINT PRIMARY KEY, created_at TIMESTAMPTZ NOT NULL);
CREATE OR REPLACE FUNCTION exp_track() RETURNS trigger LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
BEGIN
    INSERT INTO exp_unfinished (key_id, created_at) VALUES (NEW.id, NEW.created_at) ON CONFLICT (key_id) DO NOTHING;
    RETURN NULL;
END $$;
CREATE TRIGGER exp_track AFTER INSERT ON idempotency_keys FOR EACH ROW WHEN (NEW.recovery_point <> 'finished') EXECUTE FUNCTION exp_track();`
	expSideDelete = `
CREATE OR REPLACE FUNCTION exp_untrack() RETURNS trigger LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
BEGIN
    DELETE FROM exp_unfinished WHERE key_id = NEW.id;
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
		sqlVariant("partial index (00002)", expPartial),
		sqlVariant("created_at index only", expNoPartial),
		sqlVariant("side table, insert trigger", expNoPartial, expSide),
		sqlVariant("side, insert+delete triggers", expNoPartial, expSide, expSideDelete),
		sqlVariant("side, insert trigger, ff90", expNoPartial, expSide, expFF90),
		sqlVariant("partial index, ff90", expPartial, expFF90),
	}
	if os.Getenv("IDEMD_HOT_VARIANTS") == "short" {
		variants = []HotVariant{ArticleVariant, variants[2], variants[3], variants[4]}
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
