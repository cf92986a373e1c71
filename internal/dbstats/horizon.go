package dbstats

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// MaxSessionHolders bounds the session series of a pass: the oldest holder
// of each application_name, and of those the oldest few. An API that puts
// a pod or process name in its application_name would otherwise make a
// series per connection; the holder that matters, the oldest, is always
// among them.
const MaxSessionHolders = 5

// horizonSQL reads, in one statement, everything that holds the database's
// xmin horizon back: what VACUUM may not remove because someone may still
// see it.
//
//   - Sessions of this database, and those of none (a walsender relaying a
//     standby's hot_standby_feedback holds back every database), by
//     application_name: the oldest holder of each name, the oldest
//     @max_sessions names. A session holds the horizon with its snapshot
//     (backend_xmin) and with its own transaction id (backend_xid: a
//     transaction that wrote and sits idle between statements has no
//     snapshot, and still holds the horizon at its xid). Rows without a
//     user (autovacuum workers, the server's own processes) are left out:
//     a VACUUM's xmin holds nothing back (PostgreSQL ignores it), and an
//     autovacuum ANALYZE ends by itself. So is the pass's own session.
//     The age in seconds counts from the transaction's start, or the
//     connection's when it has none (a walsender); it is NULL where the
//     role may not read other roles' sessions' times (no
//     pg_read_all_stats): backend_xmin, backend_xid and application_name
//     are shown to every role, the times are not.
//   - Replication slots, of every database (a slot's xmin and catalog_xmin
//     hold back every database), by age in transactions: a slot has no
//     time of its own.
//   - Prepared transactions of this database: how many, the oldest's age
//     in transactions and since it was prepared.
//
// All three are views over shared memory, read without a table scan: the
// cost grows with max_connections, max_replication_slots and
// max_prepared_transactions, not with the data.
const horizonSQL = `
WITH sessions AS (
    SELECT DISTINCT ON (application_name)
           application_name AS name,
           greatest(age(backend_xid), age(backend_xmin))::int8 AS xids,
           extract(epoch FROM now() - coalesce(xact_start, backend_start))::float8 AS secs
    FROM pg_stat_activity
    WHERE (datname = current_database() OR datid IS NULL)
      AND usesysid IS NOT NULL
      AND pid <> pg_backend_pid()
      AND (backend_xid IS NOT NULL OR backend_xmin IS NOT NULL)
    ORDER BY application_name, xids DESC, secs DESC NULLS LAST
)
SELECT pg_has_role('pg_read_all_stats', 'USAGE'),
       (SELECT coalesce(json_agg(s ORDER BY s.xids DESC, s.name), '[]')
        FROM (SELECT * FROM sessions ORDER BY xids DESC, name LIMIT @max_sessions) s),
       (SELECT coalesce(json_agg(json_build_object('name', slot_name, 'xids', age(xmin), 'catalog_xids', age(catalog_xmin)) ORDER BY slot_name), '[]')
        FROM pg_replication_slots
        WHERE xmin IS NOT NULL OR catalog_xmin IS NOT NULL),
       p.n, p.xids, p.secs
FROM (SELECT count(*) AS n,
             max(age(transaction))::int8 AS xids,
             extract(epoch FROM now() - min(prepared))::float8 AS secs
      FROM pg_prepared_xacts
      WHERE database = current_database()) p`

// Horizon is what held the database's xmin horizon back at a pass.
type Horizon struct {
	// ReadAllStats: the role may read every session's times (a member of
	// pg_read_all_stats, as deploy/sql/roles.sql grants). Without it the
	// sessions of other roles have no Age.
	ReadAllStats bool
	// Sessions: the oldest holder of each application_name, oldest first,
	// at most MaxSessionHolders.
	Sessions []SessionHolder
	// Slots: the replication slots that hold an xmin or a catalog_xmin,
	// by name.
	Slots []SlotHolder
	// Prepared: the prepared transactions of this database.
	Prepared PreparedHolders
}

// SessionHolder is the oldest session of one application_name that holds
// the horizon.
type SessionHolder struct {
	ApplicationName string
	// AgeXIDs is the age in transactions of its xmin or its own
	// transaction id, whichever is older.
	AgeXIDs int64
	// Age is how long its transaction has been open (its connection, for
	// a session without a transaction); nil when the role may not read it.
	Age *time.Duration
}

// SlotHolder is a replication slot that holds the horizon.
type SlotHolder struct {
	Name string
	// XminAgeXIDs and CatalogXminAgeXIDs are the ages of its xmin (a
	// physical slot fed by hot_standby_feedback) and catalog_xmin (a
	// logical slot); nil when the slot holds none.
	XminAgeXIDs, CatalogXminAgeXIDs *int64
}

// PreparedHolders are the prepared transactions.
type PreparedHolders struct {
	Count int64
	// OldestAgeXIDs and OldestAge are the oldest one's age in transactions
	// and since it was prepared; nil when there is none.
	OldestAgeXIDs *int64
	OldestAge     *time.Duration
}

// horizonRow is horizonSQL's row: the sessions and slots as JSON.
type horizonRow struct {
	ReadAllStats  bool
	Sessions      []byte
	Slots         []byte
	PreparedCount int64
	PreparedXIDs  *int64
	PreparedSecs  *float64
}

// readHorizon runs horizonSQL on q (the pass's transaction, under its
// statement timeout).
func readHorizon(ctx context.Context, q Querier) (*Horizon, error) {
	r, err := q.Query(ctx, horizonSQL, pgx.NamedArgs{"max_sessions": MaxSessionHolders})
	if err != nil {
		return nil, fmt.Errorf("read the xmin horizon: %w", err)
	}
	row, err := pgx.CollectExactlyOneRow(r, pgx.RowToStructByPos[horizonRow])
	if err != nil {
		return nil, fmt.Errorf("read the xmin horizon: %w", err)
	}
	h, err := buildHorizon(row)
	if err != nil {
		return nil, fmt.Errorf("read the xmin horizon: %w", err)
	}
	return h, nil
}

// buildHorizon decodes the query's row. Pure, so the handling of empty
// sets and hidden times is tested without a database.
func buildHorizon(row horizonRow) (*Horizon, error) {
	var sessions []struct {
		Name string   `json:"name"`
		XIDs int64    `json:"xids"`
		Secs *float64 `json:"secs"`
	}
	if err := json.Unmarshal(row.Sessions, &sessions); err != nil {
		return nil, fmt.Errorf("decode sessions: %w", err)
	}
	var slots []struct {
		Name        string `json:"name"`
		XIDs        *int64 `json:"xids"`
		CatalogXIDs *int64 `json:"catalog_xids"`
	}
	if err := json.Unmarshal(row.Slots, &slots); err != nil {
		return nil, fmt.Errorf("decode replication slots: %w", err)
	}
	h := &Horizon{
		ReadAllStats: row.ReadAllStats,
		Sessions:     make([]SessionHolder, 0, len(sessions)),
		Slots:        make([]SlotHolder, 0, len(slots)),
		Prepared:     PreparedHolders{Count: row.PreparedCount},
	}
	for _, s := range sessions {
		h.Sessions = append(h.Sessions, SessionHolder{ApplicationName: s.Name, AgeXIDs: s.XIDs, Age: secondsPtr(s.Secs)})
	}
	for _, s := range slots {
		h.Slots = append(h.Slots, SlotHolder{Name: s.Name, XminAgeXIDs: s.XIDs, CatalogXminAgeXIDs: s.CatalogXIDs})
	}
	if row.PreparedCount > 0 {
		h.Prepared.OldestAgeXIDs = row.PreparedXIDs
		h.Prepared.OldestAge = secondsPtr(row.PreparedSecs)
	}
	return h, nil
}

// secondsPtr turns the database's seconds into a duration, never negative:
// now() is when the pass's transaction began, which a session's may follow
// by a moment.
func secondsPtr(secs *float64) *time.Duration {
	if secs == nil {
		return nil
	}
	d := max(0, time.Duration(*secs*float64(time.Second)))
	return &d
}
