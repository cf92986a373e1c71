package migrate_test

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemd/idemd/internal/migrate"
	"github.com/idemd/idemd/internal/testing/articletest"
)

// The statements below are what an API written as the article (Sinatra,
// Sequel with its pg_json extension) sends for its last phase,
// key.update(locked_at: nil, recovery_point: "finished", response_code:
// 201, response_body: {message: "..."}), as Sequel 5 logs them. Sequel
// typecasts the Hash by the column's type in the model's schema: for a
// JSONB column into a JSONB literal, and for a TEXT column not at all (the
// string typecast fails, silently by default), so the Hash is literalised
// as a condition, ("message" = '...'), and PostgreSQL looks for a column
// named message. Only the id is a parameter here, where Sequel inlines it.
const (
	sequelHashOnJSONB = `UPDATE "idempotency_keys" SET "locked_at" = NULL, "recovery_point" = 'finished', "response_code" = 201, "response_body" = '{"message":"Payment accepted."}'::jsonb WHERE ("id" = $1)`
	sequelHashOnText  = `UPDATE "idempotency_keys" SET "locked_at" = NULL, "recovery_point" = 'finished', "response_code" = 201, "response_body" = ("message" = 'Payment accepted.') WHERE ("id" = $1)`
	// The same phase written as docs/operations.md asks before the
	// adoption: the body JSON-encoded by the API (JSON.generate), sent as
	// an untyped parameter, so PostgreSQL types it by the column and the
	// same code runs on JSONB and on TEXT.
	encodedBody  = `UPDATE idempotency_keys SET locked_at = NULL, recovery_point = 'finished', response_code = 201, response_body = $2 WHERE id = $1`
	jsonbParam   = `UPDATE idempotency_keys SET locked_at = NULL, recovery_point = 'finished', response_code = 201, response_body = $2::jsonb WHERE id = $1`
	wrapped      = `{"message":"Payment accepted."}`
	jsonbsOwnTxt = `{"message": "Payment accepted."}` // PostgreSQL's text of that JSONB value
)

// What `idemctl migrate`'s hint and docs/operations.md say about the API's
// writes of response_body, on a database with the article's schema:
// migrated but not adopted, the article's writes (a Hash through Sequel,
// a parameter typed jsonb) work; after --adopt-article-schema, Sequel's
// Hash fails with undefined_column, leaving the key unfinished at its last
// recovery point, a jsonb parameter is stored as JSONB's text rather than
// the bytes written, and a JSON-encoded string written untyped works on
// both and is stored byte for byte after.
func TestAdoptArticleAPIWrites(t *testing.T) {
	runtime, migrator := articlePools(t)
	ctx := context.Background()

	var n int
	key := func() int64 {
		t.Helper()
		n++
		var id int64
		if err := runtime.QueryRow(ctx, `INSERT INTO idempotency_keys
			(idempotency_key, user_id, locked_at, request_method, request_path, request_params, recovery_point)
			VALUES ('writes-' || $1::int, $2, now(), 'POST', '/rides', '{}', 'charge_created') RETURNING id`,
			n, articletest.UserID).Scan(&id); err != nil {
			t.Fatal(err)
		}
		return id
	}
	api := runtime
	finish := func(sql string, args ...any) (id int64, err error) {
		t.Helper()
		id = key()
		tag, err := api.Exec(ctx, sql, append([]any{id}, args...)...)
		if err == nil && tag.RowsAffected() != 1 {
			t.Fatalf("%s: %d rows", sql, tag.RowsAffected())
		}
		return id, err
	}
	// stored is the key's state by an independent read: its recovery
	// point, response_body's type and its text.
	stored := func(id int64) (point, typ string, body *string) {
		t.Helper()
		if err := runtime.QueryRow(ctx, `SELECT recovery_point, pg_typeof(response_body)::text, response_body::text
			FROM idempotency_keys WHERE id = $1`, id).Scan(&point, &typ, &body); err != nil {
			t.Fatal(err)
		}
		return point, typ, body
	}
	mustStore := func(name string, id int64, err error, typ, want string) {
		t.Helper()
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		p, ty, b := stored(id)
		if p != "finished" || ty != typ || b == nil || *b != want {
			t.Fatalf("%s: stored %s %s %v, want finished %s %q", name, p, ty, deref(b), typ, want)
		}
	}

	// Migrated, not adopted: the article's API works as it is.
	id, err := finish(sequelHashOnJSONB)
	mustStore("Sequel's Hash on JSONB", id, err, "jsonb", jsonbsOwnTxt)
	id, err = finish(jsonbParam, wrapped)
	mustStore("jsonb parameter on JSONB", id, err, "jsonb", jsonbsOwnTxt)
	id, err = finish(encodedBody, wrapped)
	mustStore("encoded body on JSONB", id, err, "jsonb", jsonbsOwnTxt)

	if _, err := migrate.AdoptArticleSchema(ctx, migrator, migrate.AdoptOptions{}); err != nil {
		t.Fatal(err)
	}
	// The API's pool predates the swap; a new one is a restarted API.
	fresh, err := pgxpool.New(ctx, runtime.Config().ConnString())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(fresh.Close)

	for _, pool := range []*pgxpool.Pool{runtime, fresh} {
		// Sequel with the model's schema reloaded (a restart, a new
		// process): the last phase fails after the upstream call it
		// follows, and the key stays unfinished.
		id = key()
		_, err = pool.Exec(ctx, sequelHashOnText, id)
		var pg *pgconn.PgError
		if !errors.As(err, &pg) || pg.Code != "42703" {
			t.Fatalf("Sequel's Hash on TEXT: %v, want undefined_column (42703)", err)
		}
		if p, _, b := stored(id); p != "charge_created" || b != nil {
			t.Fatalf("after the failed write the key is %s with body %v", p, deref(b))
		}
	}
	// From here on a restarted API: a connection that prepared a statement
	// before the swap keeps its parameter's jsonb type, as pgx's cache
	// does, until it reconnects.
	api = fresh
	// A JSONB value is still assigned (PostgreSQL's assignment cast to
	// text), and what is stored is its text, not the bytes written: a
	// process whose Sequel model still has the JSONB schema, or a ::jsonb
	// parameter. An API reading the column now gets text, not an object.
	id, err = finish(sequelHashOnJSONB)
	mustStore("Sequel's Hash as JSONB on TEXT", id, err, "text", jsonbsOwnTxt)
	id, err = finish(jsonbParam, wrapped)
	mustStore("jsonb parameter on TEXT", id, err, "text", jsonbsOwnTxt)
	// The encoded body, untyped, is stored byte for byte.
	id, err = finish(encodedBody, wrapped)
	mustStore("encoded body on TEXT", id, err, "text", wrapped)
	var finished int
	if err := runtime.QueryRow(ctx, `SELECT count(*) FROM idempotency_keys
		WHERE idempotency_key LIKE 'writes-%' AND recovery_point = 'finished'`).Scan(&finished); err != nil {
		t.Fatal(err)
	}
	if finished != 6 {
		t.Fatalf("%d keys finished, want 6 (3 before, 3 after the adoption)", finished)
	}
}

func deref(s *string) any {
	if s == nil {
		return nil
	}
	return *s
}
