package dbstats

import (
	"context"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/idemd/idemd/internal/testing/dbtest"
)

func TestBuildHorizon(t *testing.T) {
	t.Parallel()
	i64 := func(v int64) *int64 { return &v }
	f64 := func(v float64) *float64 { return &v }
	dur := func(d time.Duration) *time.Duration { return &d }
	for _, tc := range []struct {
		name string
		row  horizonRow
		want Horizon
	}{
		{
			name: "nothing holds the horizon: no holders, no prepared transaction",
			row:  horizonRow{ReadAllStats: true, Sessions: []byte(`[]`), Slots: []byte(`[]`)},
			want: Horizon{ReadAllStats: true, Sessions: []SessionHolder{}, Slots: []SlotHolder{}},
		},
		{
			name: "sessions in the query's order, a hidden time left nil, a start a moment after now() at 0",
			row: horizonRow{
				Sessions: []byte(`[{"name":"api-long-tx","xids":1200,"secs":null},{"name":"","xids":30,"secs":-0.002},{"name":"idemd-enqueuer","xids":3,"secs":1.5}]`),
				Slots:    []byte(`[]`),
			},
			want: Horizon{
				Sessions: []SessionHolder{
					{ApplicationName: "api-long-tx", AgeXIDs: 1200},
					{ApplicationName: "", AgeXIDs: 30, Age: dur(0)},
					{ApplicationName: "idemd-enqueuer", AgeXIDs: 3, Age: dur(1500 * time.Millisecond)},
				},
				Slots: []SlotHolder{},
			},
		},
		{
			name: "slots with an xmin, a catalog_xmin or both; prepared transactions",
			row: horizonRow{
				ReadAllStats:  true,
				Sessions:      []byte(`[]`),
				Slots:         []byte(`[{"name":"standby_1","xids":500,"catalog_xids":null},{"name":"cdc","xids":null,"catalog_xids":90}]`),
				PreparedCount: 2, PreparedXIDs: i64(77), PreparedSecs: f64(600),
			},
			want: Horizon{
				ReadAllStats: true,
				Sessions:     []SessionHolder{},
				Slots: []SlotHolder{
					{Name: "standby_1", XminAgeXIDs: i64(500)},
					{Name: "cdc", CatalogXminAgeXIDs: i64(90)},
				},
				Prepared: PreparedHolders{Count: 2, OldestAgeXIDs: i64(77), OldestAge: dur(10 * time.Minute)},
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := buildHorizon(tc.row)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(*got, tc.want) {
				t.Errorf("buildHorizon:\n got %s\nwant %s", fmtHorizon(*got), fmtHorizon(tc.want))
			}
		})
	}
	if _, err := buildHorizon(horizonRow{Sessions: []byte(`{`), Slots: []byte(`[]`)}); err == nil {
		t.Error("sessions that are not JSON decoded without an error")
	}
}

// fmtHorizon prints a Horizon with its pointers' values.
func fmtHorizon(h Horizon) string {
	var b strings.Builder
	fmt.Fprintf(&b, "read_all_stats=%v sessions=[", h.ReadAllStats)
	for _, s := range h.Sessions {
		fmt.Fprintf(&b, " %q xids=%d age=%s", s.ApplicationName, s.AgeXIDs, fmtPtr(s.Age))
	}
	b.WriteString(" ] slots=[")
	for _, s := range h.Slots {
		fmt.Fprintf(&b, " %q xmin=%s catalog_xmin=%s", s.Name, fmtPtr(s.XminAgeXIDs), fmtPtr(s.CatalogXminAgeXIDs))
	}
	fmt.Fprintf(&b, " ] prepared=%d xids=%s age=%s", h.Prepared.Count, fmtPtr(h.Prepared.OldestAgeXIDs), fmtPtr(h.Prepared.OldestAge))
	return b.String()
}

func fmtPtr[T any](p *T) string {
	if p == nil {
		return "nil"
	}
	return fmt.Sprint(*p)
}

// holder opens a connection to dbURL with the given application_name,
// closed when the test ends: a session of the API.
func holder(t *testing.T, dbURL, appName string) *pgx.Conn {
	t.Helper()
	ctx := context.Background()
	cfg, err := pgx.ParseConfig(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	cfg.RuntimeParams["application_name"] = appName
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

// holdSnapshot opens a transaction on conn that keeps its snapshot, as a
// report or a forgotten transaction of the API does.
func holdSnapshot(t *testing.T, conn *pgx.Conn) {
	t.Helper()
	ctx := context.Background()
	if _, err := conn.Exec(ctx, "BEGIN ISOLATION LEVEL REPEATABLE READ"); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, "SELECT 1"); err != nil {
		t.Fatal(err)
	}
}

// holdXID opens a transaction on conn that takes a transaction id and
// sits idle: in READ COMMITTED it keeps no snapshot between statements,
// and holds the horizon at its own id. Each such holder is a transaction
// younger than the one before, whatever else runs on the server (a
// snapshot's xmin is any running transaction's id, another database's
// too).
func holdXID(t *testing.T, conn *pgx.Conn) {
	t.Helper()
	ctx := context.Background()
	if _, err := conn.Exec(ctx, "BEGIN ISOLATION LEVEL READ COMMITTED"); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, "SELECT pg_current_xact_id()"); err != nil {
		t.Fatal(err)
	}
}

// commitOne commits a transaction that takes a transaction id, so every
// snapshot held grows one transaction older.
func commitOne(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	if _, err := pool.Exec(context.Background(), "SELECT pg_current_xact_id()"); err != nil {
		t.Fatal(err)
	}
}

func sessionOf(res *Result, appName string) (SessionHolder, bool) {
	for _, s := range res.Horizon.Sessions {
		if s.ApplicationName == appName {
			return s, true
		}
	}
	return SessionHolder{}, false
}

// gauge returns the value of the exported series line "name{labels}".
func gauge(t *testing.T, reg *prometheus.Registry, series string) (float64, bool) {
	t.Helper()
	for _, line := range exported(t, reg) {
		if v, ok := strings.CutPrefix(line, series+" "); ok {
			var f float64
			if _, err := fmt.Sscan(v, &f); err != nil {
				t.Fatal(err)
			}
			return f, true
		}
	}
	return 0, false
}

// horizonLines is what reg exports of the xmin horizon.
func horizonLines(t *testing.T, reg *prometheus.Registry) []string {
	t.Helper()
	var out []string
	for _, line := range exported(t, reg) {
		if strings.HasPrefix(line, "idemd_db_") || strings.HasPrefix(line, "idemd_dbstats_read_all_stats{") {
			out = append(out, line)
		}
	}
	return out
}

func runOnce(t *testing.T, svc *Service) *Result {
	t.Helper()
	res, err := svc.RunOnce(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if !res.Exporting || res.Horizon == nil {
		t.Fatalf("a lone exporter's pass: %+v", res)
	}
	return res
}

// TestHorizonSession: a session of another role holding a snapshot, as the
// API's long transaction does, is exported under its application_name with
// an age in transactions and in seconds that grow from pass to pass, and
// its series are gone at the first pass after it ends. The pass's own
// session is no holder; without prepared transactions their count is 0 and
// their ages are absent (the shared server allows none:
// TestHorizonSlotsAndPrepared has them on a cluster of its own).
func TestHorizonSession(t *testing.T) {
	t.Parallel()
	pool := dbtest.NewPool(t)
	ctx := context.Background()
	svc, reg := newService(t, pool, testSettings())
	const xidsOf, secsOf = `idemd_db_session_xmin_age_transactions{application_name="api-long-tx"}`, `idemd_db_session_xmin_age_seconds{application_name="api-long-tx"}`

	res := runOnce(t, svc)
	if len(res.Horizon.Sessions) != 0 || res.Horizon.Prepared.Count != 0 || !res.Horizon.ReadAllStats {
		t.Fatalf("nothing holds the horizon, the runtime role has pg_read_all_stats: %s", fmtHorizon(*res.Horizon))
	}
	want := []string{`idemd_db_prepared_transactions{} 0`, `idemd_dbstats_read_all_stats{} 1`}
	if got := horizonLines(t, reg); !slices.Equal(got, want) {
		t.Fatalf("exported with no holder:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}

	// The API's role is not the exporter's: the migrator's stands in.
	api := holder(t, dbtest.MigratorURL(pool.Config().ConnString()), "api-long-tx")
	holdSnapshot(t, api)
	first, ok := sessionOf(runOnce(t, svc), "api-long-tx")
	if !ok || first.Age == nil {
		t.Fatalf("the pass does not report the session holding a snapshot with its age: %+v", first)
	}
	if x, ok := gauge(t, reg, xidsOf); !ok || x != float64(first.AgeXIDs) {
		t.Errorf("%s = %v (exported %v), want %d", xidsOf, x, ok, first.AgeXIDs)
	}
	if s, ok := gauge(t, reg, secsOf); !ok || s != first.Age.Seconds() {
		t.Errorf("%s = %v (exported %v), want %v", secsOf, s, ok, first.Age.Seconds())
	}

	commitOne(t, pool)
	second, ok := sessionOf(runOnce(t, svc), "api-long-tx")
	if !ok || second.Age == nil || second.AgeXIDs <= first.AgeXIDs || *second.Age <= *first.Age {
		t.Fatalf("the holder's age does not grow: first %+v (%s), then %+v (%s)", first, fmtPtr(first.Age), second, fmtPtr(second.Age))
	}
	if x, ok := gauge(t, reg, xidsOf); !ok || x != float64(second.AgeXIDs) {
		t.Errorf("%s = %v (exported %v), want %d", xidsOf, x, ok, second.AgeXIDs)
	}

	// The transaction ends; the session stays connected, holding nothing.
	if _, err := api.Exec(ctx, "COMMIT"); err != nil {
		t.Fatal(err)
	}
	res = runOnce(t, svc)
	if s, ok := sessionOf(res, "api-long-tx"); ok {
		t.Errorf("a session that ended its transaction is still reported: %+v", s)
	}
	if got := horizonLines(t, reg); !slices.Equal(got, want) {
		t.Errorf("exported after the holder ended:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// TestHorizonSessionsBounded: the sessions are exported by
// application_name, the oldest of each name, and only the oldest
// MaxSessionHolders names: seven names and a second, younger session of the
// oldest name make five series, the oldest first. A transaction that wrote
// and sits idle holds the horizon by its own id (backend_xid). When the
// oldest session ends, its name's younger session, now the youngest holder
// of all, drops out of the five, and the next name comes in.
func TestHorizonSessionsBounded(t *testing.T) {
	t.Parallel()
	pool := dbtest.NewPool(t)
	ctx := context.Background()
	svc, reg := newService(t, pool, testSettings())
	migrator := dbtest.MigratorURL(pool.Config().ConnString())
	var conns []*pgx.Conn
	for i := range 7 {
		c := holder(t, migrator, fmt.Sprintf("api-%d", i))
		holdXID(t, c)
		conns = append(conns, c)
	}
	holdXID(t, holder(t, migrator, "api-0"))

	res := runOnce(t, svc)
	var names []string
	for i, s := range res.Horizon.Sessions {
		names = append(names, s.ApplicationName)
		if i > 0 && s.AgeXIDs >= res.Horizon.Sessions[i-1].AgeXIDs {
			t.Fatalf("sessions not oldest first: %s", fmtHorizon(*res.Horizon))
		}
	}
	if want := []string{"api-0", "api-1", "api-2", "api-3", "api-4"}; !slices.Equal(names, want) {
		t.Fatalf("sessions exported %v, want the oldest of each name, the %d oldest: %v", names, MaxSessionHolders, want)
	}
	series := func() []string {
		var out []string
		for _, line := range horizonLines(t, reg) {
			if name, ok := strings.CutPrefix(line, `idemd_db_session_xmin_age_seconds{application_name="`); ok {
				out = append(out, name[:strings.Index(name, `"`)])
			}
		}
		return out
	}
	if got := series(); !slices.Equal(got, names) {
		t.Errorf("seconds series for %v, want %v", got, names)
	}

	// The oldest api-0 ends: api-0's younger session is now the youngest
	// holder of all, out of the five; api-5 comes in.
	if _, err := conns[0].Exec(ctx, "COMMIT"); err != nil {
		t.Fatal(err)
	}
	runOnce(t, svc)
	if got, want := series(), []string{"api-1", "api-2", "api-3", "api-4", "api-5"}; !slices.Equal(got, want) {
		t.Errorf("after the oldest holder ended: seconds series for %v, want %v", got, want)
	}
}

// TestHorizonSlotsAndPrepared runs on a cluster of its own, which allows
// prepared transactions and logical replication (the shared server allows
// neither): a logical slot is exported by its catalog_xmin's age, a
// prepared transaction by the count and the oldest's ages, both growing
// older from pass to pass and gone once they end. Then, with
// pg_read_all_stats revoked from the runtime role, another role's session
// holding a snapshot is exported by its age in transactions only,
// idemd_dbstats_read_all_stats says 0, and the exporter logs that once;
// granted again, it logs that once too and the seconds are back.
func TestHorizonSlotsAndPrepared(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c := dbtest.StartClusterWith(t, dbtest.ClusterOptions{Settings: []string{"max_prepared_transactions=2", "wal_level=logical"}})
	adminURL := c.NewMigratedDatabase(t, "idemd_dbstats_horizon")
	pool, err := pgxpool.New(ctx, dbtest.RuntimeURL(adminURL))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	admin := holder(t, adminURL, "test-admin")
	exec := func(conn *pgx.Conn, sql string) {
		t.Helper()
		if _, err := conn.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}

	core, logs := observer.New(zapcore.InfoLevel)
	reg := prometheus.NewRegistry()
	svc, err := New(Config{Settings: testSettings(), Pool: pool, Registry: reg, Logger: zap.New(core)})
	if err != nil {
		t.Fatal(err)
	}

	// The slot first: creating a logical slot waits for every running
	// transaction to end.
	exec(admin, "SELECT pg_create_logical_replication_slot('idemd_test_slot', 'test_decoding')")
	prep := holder(t, adminURL, "test-prepare")
	exec(prep, "BEGIN")
	exec(prep, "SELECT pg_current_xact_id()")
	exec(prep, "PREPARE TRANSACTION 'idemd-test-prepared'")

	first := runOnce(t, svc).Horizon
	commitOne(t, pool)
	second := runOnce(t, svc).Horizon
	for _, h := range []*Horizon{first, second} {
		if len(h.Slots) != 1 || h.Slots[0].Name != "idemd_test_slot" || h.Slots[0].XminAgeXIDs != nil || h.Slots[0].CatalogXminAgeXIDs == nil ||
			h.Prepared.Count != 1 || h.Prepared.OldestAgeXIDs == nil || h.Prepared.OldestAge == nil {
			t.Fatalf("a logical slot and a prepared transaction: %s", fmtHorizon(*h))
		}
	}
	if *second.Slots[0].CatalogXminAgeXIDs <= *first.Slots[0].CatalogXminAgeXIDs ||
		*second.Prepared.OldestAgeXIDs <= *first.Prepared.OldestAgeXIDs || *second.Prepared.OldestAge <= *first.Prepared.OldestAge {
		t.Errorf("the slot's and the prepared transaction's ages do not grow: %s, then %s", fmtHorizon(*first), fmtHorizon(*second))
	}
	for series, want := range map[string]float64{
		`idemd_db_replication_slot_catalog_xmin_age_transactions{slot_name="idemd_test_slot"}`: float64(*second.Slots[0].CatalogXminAgeXIDs),
		`idemd_db_prepared_transactions{}`:                        1,
		`idemd_db_prepared_transaction_oldest_age_transactions{}`: float64(*second.Prepared.OldestAgeXIDs),
		`idemd_db_prepared_transaction_oldest_age_seconds{}`:      second.Prepared.OldestAge.Seconds(),
	} {
		if got, ok := gauge(t, reg, series); !ok || got != want {
			t.Errorf("%s = %v (exported %v), want %v", series, got, ok, want)
		}
	}
	if _, ok := gauge(t, reg, `idemd_db_replication_slot_xmin_age_transactions{slot_name="idemd_test_slot"}`); ok {
		t.Error("a logical slot, which holds no xmin, is exported with one")
	}

	exec(admin, "ROLLBACK PREPARED 'idemd-test-prepared'")
	exec(admin, "SELECT pg_drop_replication_slot('idemd_test_slot')")
	if h := runOnce(t, svc).Horizon; len(h.Slots) != 0 || h.Prepared.Count != 0 {
		t.Errorf("after the rollback and the drop: %s", fmtHorizon(*h))
	}
	if got, want := horizonLines(t, reg), []string{`idemd_db_prepared_transactions{} 0`, `idemd_dbstats_read_all_stats{} 1`}; !slices.Equal(got, want) {
		t.Errorf("exported after the rollback and the drop:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}

	// Without pg_read_all_stats, another role's session shows its xmin
	// and its application_name, not its times.
	const hidden = "may not read other roles' sessions' times"
	api := holder(t, dbtest.MigratorURL(adminURL), "api-long-tx")
	holdSnapshot(t, api)
	exec(admin, "REVOKE pg_read_all_stats FROM "+dbtest.RuntimeRole)
	for range 2 {
		res := runOnce(t, svc)
		s, ok := sessionOf(res, "api-long-tx")
		if res.Horizon.ReadAllStats || !ok || s.Age != nil || s.AgeXIDs <= 0 {
			t.Fatalf("without pg_read_all_stats: %s", fmtHorizon(*res.Horizon))
		}
	}
	if _, ok := gauge(t, reg, `idemd_db_session_xmin_age_transactions{application_name="api-long-tx"}`); !ok {
		t.Error("without pg_read_all_stats the holder's age in transactions is not exported")
	}
	if v, ok := gauge(t, reg, `idemd_db_session_xmin_age_seconds{application_name="api-long-tx"}`); ok {
		t.Errorf("without pg_read_all_stats the holder's age in seconds is exported: %v", v)
	}
	if v, ok := gauge(t, reg, `idemd_dbstats_read_all_stats{}`); !ok || v != 0 {
		t.Errorf("idemd_dbstats_read_all_stats = %v (exported %v) without the role, want 0", v, ok)
	}
	if n := logs.FilterMessageSnippet(hidden).FilterLevelExact(zapcore.WarnLevel).Len(); n != 1 {
		t.Errorf("%d warnings that the times are hidden over two passes, want 1: %v", n, logs.All())
	}

	exec(admin, "GRANT pg_read_all_stats TO "+dbtest.RuntimeRole)
	res := runOnce(t, svc)
	if s, ok := sessionOf(res, "api-long-tx"); !res.Horizon.ReadAllStats || !ok || s.Age == nil {
		t.Fatalf("with pg_read_all_stats again: %s", fmtHorizon(*res.Horizon))
	}
	if n := logs.FilterMessageSnippet("reads every session's times").Len(); n != 1 {
		t.Errorf("%d lines that the times are visible again, want 1: %v", n, logs.All())
	}
}
