package clients

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemd/idemd/clients/clienttest"
	"github.com/idemd/idemd/idem"
	"github.com/idemd/idemd/idem/replayauth"
	"github.com/idemd/idemd/internal/migrate"
	"github.com/idemd/idemd/internal/testing/articletest"
	"github.com/idemd/idemd/internal/testing/dbtest"
	"github.com/idemd/idemd/internal/testing/replaytest"
)

func TestMain(m *testing.M) { dbtest.Main(m) }

// langTimeout bounds one language's whole test run (a few seconds here).
const langTimeout = 3 * time.Minute

// testSecret is the secret the languages' PostgreSQL tests sign with.
const testSecret = "0123456789abcdef0123456789abcdef"

// shared is one language's database, with a nonce Go's verifier recorded
// in it before the language's tests run.
type shared struct {
	db      clienttest.DB
	pool    *pgxpool.Pool // as the API's role
	goNonce string
	goTS    int64
}

func newShared(t *testing.T) *shared {
	t.Helper()
	db := clienttest.NewAPIDatabase(t)
	pool, err := pgxpool.New(context.Background(), db.APIURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	s := &shared{db: db, pool: pool, goNonce: "go-" + hex.EncodeToString(b), goTS: time.Now().Unix()}
	// Go's verifier accepts a signature and records its nonce in
	// idemd_replay_nonces, as a Go replica of the API would.
	uid, err := s.goVerifier(t, s.goTS).Verify(context.Background(), s.sign(t, s.goNonce), s.request())
	if err != nil || uid != 42 {
		t.Fatalf("Go verifier: uid %d, err %v", uid, err)
	}
	return s
}

func (s *shared) request() replayauth.Request {
	return replayauth.Request{Method: "POST", Path: "/orders", UserID: 42, IdempotencyKey: "k"}
}

func (s *shared) sign(t *testing.T, nonce string) string {
	return replaytest.SignAt(s.goTS, nonce, s.request(), []byte(testSecret))
}

func (s *shared) goVerifier(t *testing.T, now int64) *replayauth.Verifier {
	v, err := replayauth.NewVerifier(0, sec(t, testSecret))
	if err != nil {
		t.Fatal(err)
	}
	return v.WithClock(func() time.Time { return time.Unix(now, 0) }).
		WithNonceStore(idem.NewReplayNonces(s.pool, idem.ReplayNoncesOptions{}))
}

// env is what every language's PostgreSQL tests read.
func (s *shared) env() []string {
	return []string{
		"IDEMD_TEST_DATABASE_URL=" + s.db.APIURL,
		"IDEMD_GO_NONCE=" + s.goNonce,
		"IDEMD_GO_NONCE_TS=" + strconv.FormatInt(s.goTS, 10),
	}
}

// refusedByGo checks that nonces a language's store recorded are refused
// by Go's verifier on the same table: one replay protection across
// replicas in different languages.
func (s *shared) refusedByGo(t *testing.T, nonces ...string) {
	t.Helper()
	for _, n := range nonces {
		_, err := s.goVerifier(t, s.goTS).Verify(context.Background(), s.sign(t, n), s.request())
		if !errors.Is(err, replayauth.ErrReplayed) {
			t.Errorf("nonce %q recorded by the other language: Go's verifier answered %v, want ErrReplayed", n, err)
		}
	}
}

// TestPython runs clients/python's unittest suite (vectors, WSGI and ASGI
// middleware, the PostgreSQL store through psycopg2, unique keys) with
// Debian's python3. Every unique-key vector's job is inserted by River's
// InsertTx before and staged by the suite with its unique_key helper: the
// enqueuer's move after must write no second job.
func TestPython(t *testing.T) {
	py := clienttest.Python(t)
	s := newShared(t)
	u := newUniqueStaging(t, s.db)
	dir := filepath.Join(clienttest.Root(t), "clients", "python")
	out := clienttest.Run(t, dir, s.env(), langTimeout, py, "-m", "unittest", "discover", "-v", "-s", "tests", "-t", "tests")
	mustNotSkipPostgres(t, out, "skipped 'IDEMD_TEST_DATABASE_URL")
	s.refusedByGo(t, "py-once", "py-verifier")
	u.after(t)
}

// TestRuby runs clients/ruby's minitest suite (vectors, Rack middleware,
// the PostgreSQL store through ruby-pg, unique keys) with Debian's ruby,
// unique-key vectors staged as in TestPython.
func TestRuby(t *testing.T) {
	rb := clienttest.Ruby(t)
	s := newShared(t)
	u := newUniqueStaging(t, s.db)
	dir := filepath.Join(clienttest.Root(t), "clients", "ruby")
	out := clienttest.Run(t, dir, s.env(), langTimeout, rb, "-Ilib", "-Itest", "test/all.rb", "--verbose")
	mustNotSkipPostgres(t, out, "IDEMD_TEST_DATABASE_URL needed")
	s.refusedByGo(t, "rb-once", "rb-verifier")
	u.after(t)
}

// TestNode runs clients/node's node:test suite (vectors, Express/connect
// middleware, the PostgreSQL store through a psql-backed query function,
// the Express example with node-pg from its npm install, unique keys),
// unique-key vectors staged as in TestPython.
func TestNode(t *testing.T) {
	node := clienttest.Node(t)
	psql := clienttest.Psql(t)
	s := newShared(t)
	u := newUniqueStaging(t, s.db)
	dir := filepath.Join(clienttest.Root(t), "clients", "node")
	clienttest.NodePackages(t, node, filepath.Join(dir, "example"), "express", "pg", "idemd-replayauth")
	env := append(s.env(), "IDEMD_PSQL="+psql)
	out := clienttest.Run(t, dir, env, langTimeout, node, "--test",
		"test/vectors.test.js", "test/uniquekey.test.js", "test/middleware.test.js", "test/postgres.test.js", "test/express_example.test.js")
	mustNotSkipPostgres(t, out, "# SKIP IDEMD_TEST_DATABASE_URL")
	s.refusedByGo(t, "js-once", "js-verifier")
	u.after(t)
}

func mustNotSkipPostgres(t *testing.T, out, marker string) {
	t.Helper()
	if strings.Contains(out, marker) {
		t.Fatalf("the PostgreSQL tests skipped although the database was given")
	}
}

// TestRubySinatraOnArticleSchema runs the Sinatra example's test on a
// database that started from the article's schema, migrated but not
// adopted (response_body JSONB), and again after `idemctl migrate
// --adopt-article-schema` (TEXT): the example's writes (an encoded string,
// untyped) and reads (response_body::text) work on both, as
// docs/languages/ruby.md tells an API from the article to write them.
func TestRubySinatraOnArticleSchema(t *testing.T) {
	rb := clienttest.Ruby(t)
	ctx := context.Background()
	u := articletest.NewDatabase(t) // as the runtime role, which the example runs as here
	admin, err := pgx.Connect(ctx, dbtest.AdminURL(t, u))
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
	// The API's own table and user, which its role (here the runtime's)
	// may use.
	if _, err := admin.Exec(ctx, `
CREATE TABLE orders (id bigserial PRIMARY KEY, user_id bigint NOT NULL,
    key_id bigint NOT NULL UNIQUE, sku text NOT NULL, quantity int NOT NULL);
GRANT SELECT, INSERT ON orders TO `+dbtest.RuntimeRole+`;
GRANT USAGE ON SEQUENCE orders_id_seq TO `+dbtest.RuntimeRole+`;
INSERT INTO users (id, email) VALUES (42, 'orders@example.com');`); err != nil {
		t.Fatal(err)
	}
	migrator, err := pgxpool.New(ctx, dbtest.MigratorURL(u))
	if err != nil {
		t.Fatal(err)
	}
	defer migrator.Close()
	dir := filepath.Join(clienttest.Root(t), "clients", "ruby")
	for _, want := range []string{"jsonb", "text"} {
		if want == "text" {
			if _, err := migrate.AdoptArticleSchema(ctx, migrator, migrate.AdoptOptions{}); err != nil {
				t.Fatal(err)
			}
		}
		typ, err := migrate.ResponseBodyType(ctx, migrator)
		if err != nil || typ != want {
			t.Fatalf("response_body is %q (%v), want %s", typ, err, want)
		}
		out := clienttest.Run(t, dir, []string{"IDEMD_TEST_DATABASE_URL=" + u}, langTimeout, rb,
			"-Ilib", "-Itest", "test/test_sinatra_example.rb", "--verbose")
		mustNotSkipPostgres(t, out, "IDEMD_TEST_DATABASE_URL needed")
	}
}
