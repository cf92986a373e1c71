package idem_test

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemd/idemd/idem"
	"github.com/idemd/idemd/internal/testing/articletest"
	"github.com/idemd/idemd/internal/testing/dbtest"
)

// articleStore opens a Store on a database that started from the article's
// schema (response_body JSONB, keys of at most 100 characters) and was
// migrated by idemd but not adopted.
func articleStore(t *testing.T) (*idem.Store, *pgxpool.Pool) {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), articletest.NewDatabase(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	s, err := idem.Open(context.Background(), pool, idem.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return s, pool
}

func articleReq(key string) idem.Request {
	return idem.Request{UserID: articletest.UserID, Key: key, Method: "POST", Path: "/rides", Params: map[string]any{"origin": "x"}}
}

// finishWith runs a one-phase flow that answers status and body.
func finishWith(t *testing.T, s *idem.Store, key string, status int, body []byte) (*idem.Outcome, error) {
	t.Helper()
	return s.Execute(context.Background(), articleReq(key), idem.Phases{
		idem.RecoveryPointStarted: func(ctx context.Context, tx pgx.Tx, k *idem.Key) (idem.Result, error) {
			return idem.Response(status, body), nil
		},
	})
}

func storedBody(t *testing.T, pool *pgxpool.Pool, key string) *string {
	t.Helper()
	var b *string
	if err := pool.QueryRow(context.Background(), `SELECT response_body::text FROM idempotency_keys WHERE idempotency_key = $1`, key).Scan(&b); err != nil {
		t.Fatal(err)
	}
	return b
}

func TestOpenReadsTheSchema(t *testing.T) {
	t.Parallel()
	native, _ := newStore(t, idem.Options{})
	if got := native.MaxKeyLength(); got != 0 {
		t.Fatalf("New read the schema before first use: MaxKeyLength %d", got)
	}
	if _, err := native.Begin(context.Background(), req("first-use")); err != nil {
		t.Fatal(err)
	}
	if got := native.MaxKeyLength(); got != idem.MaxKeyLength {
		t.Fatalf("idemd's schema: MaxKeyLength %d, want %d", got, idem.MaxKeyLength)
	}
	article, _ := articleStore(t)
	if got := article.MaxKeyLength(); got != 100 {
		t.Fatalf("article's schema: MaxKeyLength %d, want 100", got)
	}
}

// A database without idemd's table: Open says what to run, and so does the
// first Begin of a Store from New.
func TestOpenMissingSchema(t *testing.T) {
	t.Parallel()
	cfg, err := pgxpool.ParseConfig(dbtest.NewDatabase(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.RuntimeParams["search_path"] = "no_such_schema"
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	_, err = idem.Open(context.Background(), pool, idem.Options{})
	if !errors.Is(err, idem.ErrSchema) || !strings.Contains(err.Error(), "idemctl migrate") {
		t.Fatalf("Open: %v, want ErrSchema naming idemctl migrate", err)
	}
	_, err = idem.New(pool, idem.Options{}).Begin(context.Background(), req("k"))
	if !errors.Is(err, idem.ErrSchema) {
		t.Fatalf("Begin: %v, want ErrSchema", err)
	}
}

// Keys longer than the column admits get ErrKeyTooLong, a 400 naming the
// column's limit, before the database is asked: the pool is closed here.
func TestArticleSchemaKeyLimit(t *testing.T) {
	t.Parallel()
	s, pool := articleStore(t)
	ok := strings.Repeat("é", 100)
	if _, err := finishWith(t, s, ok, 201, []byte(`{}`)); err != nil {
		t.Fatalf("100 characters: %v", err)
	}
	pool.Close()
	for _, n := range []int{101, 255} {
		_, err := s.Begin(context.Background(), articleReq(strings.Repeat("é", n)))
		if !errors.Is(err, idem.ErrKeyTooLong) {
			t.Fatalf("%d characters: %v, want ErrKeyTooLong", n, err)
		}
		rec := httptest.NewRecorder()
		s.WriteError(rec, err)
		if rec.Code != http.StatusBadRequest || !strings.Contains(rec.Body.String(), idem.MsgKeyTooLong(100)) {
			t.Fatalf("%d characters: %d %s", n, rec.Code, rec.Body)
		}
	}
}

// A narrower limit of the API's own (a CHECK with another spelling) is
// found too.
func TestKeyLimitFromOwnCheck(t *testing.T) {
	t.Parallel()
	pool := dbtest.NewPool(t)
	ctx := context.Background()
	if _, err := dbtest.MigratorPool(t, pool).Exec(ctx, `ALTER TABLE idempotency_keys
		ADD CONSTRAINT api_key_len CHECK (length(idempotency_key) < 65) NOT VALID`); err != nil {
		t.Fatal(err)
	}
	s, err := idem.Open(ctx, pool, idem.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if got := s.MaxKeyLength(); got != 64 {
		t.Fatalf("MaxKeyLength %d, want 64", got)
	}
	if _, err := s.Begin(ctx, req(strings.Repeat("k", 65))); !errors.Is(err, idem.ErrKeyTooLong) {
		t.Fatalf("65 characters: %v", err)
	}
	if _, err := s.Begin(ctx, req(strings.Repeat("k", 64))); err != nil {
		t.Fatalf("64 characters: %v", err)
	}
}

// On the article's JSONB column the response is the stored JSONB value's
// text: PostgreSQL's canonical form, the same on the first response and on
// every replay; a body that is not JSON is stored as a JSON string of its
// text instead of failing with 22P02.
func TestArticleSchemaResponses(t *testing.T) {
	t.Parallel()
	s, pool := articleStore(t)
	ctx := context.Background()
	for _, c := range []struct {
		name, body string
		want       *string // nil: PostgreSQL's jsonb text of body
	}{
		{name: "json reordered and respaced", body: `{"zeta": 1,   "a":[1, 2.50, 1e2],"b":"x\u00e9\/"}`},
		{name: "duplicate key", body: `{"a":1,"a":2}`},
		{name: "plain text", body: "Payment accepted.\n", want: ptr(`"Payment accepted.\n"`)},
		{name: "html", body: "<p>a & b</p>", want: ptr(`"<p>a & b</p>"`)},
		{name: "json with NUL escape", body: `{"a":"\u0000"}`, want: ptr(`"{\"a\":\"\\u0000\"}"`)},
		{name: "escaped backslash then u0000 is JSON", body: `{"a":"\\u0000"}`},
		{name: "bare string", body: `"already a JSON string"`},
		{name: "number", body: `12.50`},
		{name: "empty", body: ``, want: ptr(``)},
	} {
		t.Run(c.name, func(t *testing.T) {
			key := "resp-" + c.name
			want := c.want
			if want == nil {
				var canon string
				if err := pool.QueryRow(ctx, `SELECT $1::jsonb::text`, c.body).Scan(&canon); err != nil {
					t.Fatal(err)
				}
				want = &canon
			}
			first, err := finishWith(t, s, key, 201, []byte(c.body))
			if err != nil {
				t.Fatal(err)
			}
			if string(first.Body) != *want || first.Replayed {
				t.Fatalf("first response %q (replayed %v), want %q", first.Body, first.Replayed, *want)
			}
			replay, err := finishWith(t, s, key, 500, []byte(`not used`))
			if err != nil {
				t.Fatal(err)
			}
			if !replay.Replayed || replay.Status != 201 || !bytes.Equal(replay.Body, first.Body) {
				t.Fatalf("replay %d %q (replayed %v), want 201 %q", replay.Status, replay.Body, replay.Replayed, first.Body)
			}
			stored := storedBody(t, pool, key)
			switch {
			case c.body == "" && stored != nil:
				t.Fatalf("empty body stored as %q, want NULL", *stored)
			case c.body != "" && (stored == nil || *stored != *want):
				t.Fatalf("stored %v, want %q", stored, *want)
			}
		})
	}
}

// On idemd's TEXT column the replay is the body byte for byte, whatever it
// is, JSON or not.
func TestNativeSchemaReplaysByteForByte(t *testing.T) {
	t.Parallel()
	s, _ := newStore(t, idem.Options{})
	ctx := context.Background()
	for i, body := range []string{`{"zeta": 1,   "a":[1, 2.50, 1e2]}`, "plain text\r\n", `{"a":"\u0000"}`, ``, "é\t<>&"} {
		r := req("native-" + string(rune('a'+i)))
		phases := idem.Phases{idem.RecoveryPointStarted: func(ctx context.Context, tx pgx.Tx, k *idem.Key) (idem.Result, error) {
			return idem.Response(200, []byte(body)), nil
		}}
		first, err := s.Execute(ctx, r, phases)
		if err != nil {
			t.Fatal(err)
		}
		again, err := s.Execute(ctx, r, phases)
		if err != nil {
			t.Fatal(err)
		}
		if string(first.Body) != body || string(again.Body) != body || !again.Replayed {
			t.Fatalf("body %q: first %q, replay %q", body, first.Body, again.Body)
		}
	}
}

// A body no text column can hold fails the phase with ErrResponseBody on
// either schema, before anything is written: the key stays at its recovery
// point, unlocked, for a retry.
func TestUnstorableBody(t *testing.T) {
	t.Parallel()
	native, npool := newStore(t, idem.Options{})
	article, apool := articleStore(t)
	for _, c := range []struct {
		name  string
		s     *idem.Store
		pool  *pgxpool.Pool
		r     idem.Request
		body  []byte
		other string
	}{
		{"native invalid UTF-8", native, npool, req("bad-utf8"), []byte{'{', 0xff, '}'}, ""},
		{"native NUL", native, npool, req("nul"), []byte("a\x00b"), ""},
		{"article invalid UTF-8", article, apool, articleReq("bad-utf8"), []byte{0xc3}, ""},
		{"article NUL", article, apool, articleReq("nul"), []byte("a\x00b"), ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := c.s.Execute(context.Background(), c.r, idem.Phases{
				idem.RecoveryPointStarted: func(ctx context.Context, tx pgx.Tx, k *idem.Key) (idem.Result, error) {
					return idem.Response(200, c.body), nil
				},
			})
			if !errors.Is(err, idem.ErrResponseBody) || idem.StatusOf(err) != http.StatusInternalServerError {
				t.Fatalf("got %v", err)
			}
			var rp string
			var locked bool
			if err := c.pool.QueryRow(context.Background(), `SELECT recovery_point, locked_at IS NOT NULL
				FROM idempotency_keys WHERE idempotency_key = $1`, c.r.Key).Scan(&rp, &locked); err != nil {
				t.Fatal(err)
			}
			if rp != idem.RecoveryPointStarted || locked {
				t.Fatalf("key at %s locked=%v, want started and unlocked", rp, locked)
			}
		})
	}
}

func ptr(s string) *string { return &s }

// On a json column (not jsonb) a JSON body is kept as written; any other
// body is stored as a JSON string, as on jsonb.
func TestJSONColumnResponses(t *testing.T) {
	t.Parallel()
	u := articletest.NewDatabase(t)
	ctx := context.Background()
	mig, err := pgxpool.New(ctx, dbtest.MigratorURL(u))
	if err != nil {
		t.Fatal(err)
	}
	defer mig.Close()
	if _, err := mig.Exec(ctx, `ALTER TABLE idempotency_keys ALTER COLUMN response_body TYPE json`); err != nil {
		t.Fatal(err)
	}
	pool, err := pgxpool.New(ctx, u)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	s, err := idem.Open(ctx, pool, idem.Options{})
	if err != nil {
		t.Fatal(err)
	}
	for key, c := range map[string][2]string{
		"json":      {`{"zeta": 1,   "a":"\u0000"}`, `{"zeta": 1,   "a":"\u0000"}`},
		"plaintext": {"not json", `"not json"`},
	} {
		first, err := finishWith(t, s, key, 200, []byte(c[0]))
		if err != nil {
			t.Fatal(err)
		}
		replay, err := finishWith(t, s, key, 200, nil)
		if err != nil {
			t.Fatal(err)
		}
		if string(first.Body) != c[1] || string(replay.Body) != c[1] {
			t.Fatalf("%s: first %q, replay %q, want %q", key, first.Body, replay.Body, c[1])
		}
	}
}
