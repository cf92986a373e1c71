package idem

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
)

// ErrSchema is returned (wrapped, with the cause and the fix) when the
// database's idempotency_keys table is missing or has a shape idem cannot
// work with. Open returns it at once; a Store from New returns it from its
// first Begin (and every later one until the schema is fixed).
var ErrSchema = errors.New("idem: unusable idempotency_keys schema")

// ErrResponseBody is returned by a phase whose Response body the
// response_body column cannot hold: a body that is not valid UTF-8 or
// contains a NUL byte (PostgreSQL text cannot store either). Nothing is
// written; the key is unlocked at its last recovery point. It is the API's
// bug, answered with 500 like any internal error.
var ErrResponseBody = errors.New("idem: response body is not UTF-8 text without NUL bytes, which response_body cannot store")

// Response body column types idem works with.
const (
	bodyText  = "text" // idemd's schema (also varchar): stored and replayed byte for byte
	bodyJSONB = "jsonb"
	bodyJSON  = "json"
)

// schema is what idem found in the database's idempotency_keys table when
// the store first looked (see detectSchema).
type schema struct {
	// body is response_body's type: bodyText, bodyJSONB or bodyJSON.
	body string
	// maxKey is the longest idempotency_key (in characters) the column's
	// type and CHECK constraints accept: 255 on idemd's schema, 100 on the
	// article's. Longer keys are refused with ErrKeyTooLong before any
	// query.
	maxKey int
}

// jsonBody reports whether response_body is a JSON column (the article's
// JSONB, or JSON), on which a body is stored as a JSON value.
func (sc *schema) jsonBody() bool { return sc.body == bodyJSONB || sc.body == bodyJSON }

// schemaSQL reads response_body's and idempotency_key's types and every
// CHECK constraint on idempotency_key alone, from the table the store's
// queries resolve (search_path), as the runtime role may: only the system
// catalogs are read.
const schemaSQL = `
SELECT t.typname,
       CASE WHEN t.typname IN ('varchar', 'bpchar') AND a.atttypmod > 4 THEN a.atttypmod - 4 END,
       ARRAY(SELECT pg_get_constraintdef(c.oid) FROM pg_constraint c
             WHERE c.conrelid = a.attrelid AND c.contype = 'c' AND c.conkey = ARRAY[a.attnum]::int2[]
             ORDER BY c.conname)
FROM pg_attribute a
JOIN pg_type t ON t.oid = CASE WHEN (SELECT typtype FROM pg_type WHERE oid = a.atttypid) = 'd'
                               THEN (SELECT typbasetype FROM pg_type WHERE oid = a.atttypid)
                               ELSE a.atttypid END
WHERE a.attrelid = to_regclass('idempotency_keys') AND a.attname = $1
  AND a.attnum > 0 AND NOT a.attisdropped`

// detectSchema reads the table's shape. A missing table or column, or a
// response_body of a type idem does not handle, is an ErrSchema naming the
// fix.
func detectSchema(ctx context.Context, q interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}) (*schema, error) {
	var exists bool
	if err := q.QueryRow(ctx, `SELECT to_regclass('idempotency_keys') IS NOT NULL`).Scan(&exists); err != nil {
		return nil, fmt.Errorf("idem: read the idempotency_keys schema: %w", err)
	}
	if !exists {
		return nil, fmt.Errorf("%w: table idempotency_keys does not exist (or is not on the search_path); run `idemctl migrate`", ErrSchema)
	}
	column := func(name string) (typ string, typLen *int, checks []string, err error) {
		err = q.QueryRow(ctx, schemaSQL, name).Scan(&typ, &typLen, &checks)
		if errors.Is(err, pgx.ErrNoRows) {
			return "", nil, nil, fmt.Errorf("%w: idempotency_keys has no column %s; run `idemctl migrate`", ErrSchema, name)
		}
		if err != nil {
			return "", nil, nil, fmt.Errorf("idem: read the idempotency_keys schema: %w", err)
		}
		return typ, typLen, checks, nil
	}
	sc := &schema{}
	bodyType, _, _, err := column("response_body")
	if err != nil {
		return nil, err
	}
	switch bodyType {
	case "text", "varchar":
		sc.body = bodyText
	case "jsonb":
		sc.body = bodyJSONB
	case "json":
		sc.body = bodyJSON
	default:
		return nil, fmt.Errorf("%w: response_body is %s; idem stores bodies in text (idemd's schema) or jsonb/json (the article's)", ErrSchema, bodyType)
	}
	_, keyLen, checks, err := column("idempotency_key")
	if err != nil {
		return nil, err
	}
	sc.maxKey = MaxKeyLength
	if keyLen != nil && *keyLen < sc.maxKey {
		sc.maxKey = *keyLen
	}
	for _, def := range checks {
		if n, ok := checkMaxLength(def); ok && n < sc.maxKey {
			sc.maxKey = n
		}
	}
	if sc.maxKey < 1 {
		return nil, fmt.Errorf("%w: the constraints on idempotency_key admit no key at all", ErrSchema)
	}
	return sc, nil
}

// keyLengthBound matches an upper bound on the key's length as
// pg_get_constraintdef prints it: "char_length(idempotency_key) <= 100",
// with length or character_length, a cast of the column, < instead of <=,
// and BETWEEN expanded into its two comparisons.
var keyLengthBound = regexp.MustCompile(`\b(?:char_length|character_length|length)\(\(*idempotency_key\)*(?:::[a-z ]+(?:\(\d+\))?)?\)\s*(<=|<)\s*\(?(\d+)\)?`)

// keyLengthBoundReversed is the same written the other way round:
// "100 >= char_length(idempotency_key)".
var keyLengthBoundReversed = regexp.MustCompile(`\(?(\d+)\)?\s*(>=|>)\s*\(*\b(?:char_length|character_length|length)\(\(*idempotency_key\)*(?:::[a-z ]+(?:\(\d+\))?)?\)`)

// checkMaxLength returns the longest key (in characters) a CHECK
// constraint definition admits, when it bounds the key's length in a form
// keyLengthBound knows. A constraint of another form is not understood and
// yields no bound; PostgreSQL still enforces it.
func checkMaxLength(def string) (int, bool) {
	best, found := 0, false
	take := func(op, num string) {
		n, err := strconv.Atoi(num)
		if err != nil {
			return
		}
		if op == "<" || op == ">" {
			n--
		}
		if !found || n < best {
			best, found = n, true
		}
	}
	for _, m := range keyLengthBound.FindAllStringSubmatch(def, -1) {
		take(m[1], m[2])
	}
	for _, m := range keyLengthBoundReversed.FindAllStringSubmatch(def, -1) {
		take(m[2], m[1])
	}
	return best, found
}

// schemaFor returns the schema the store detected, detecting it on first
// use (New does not touch the database). A failed detection is not
// remembered: the next request tries again.
func (s *Store) schemaFor(ctx context.Context) (*schema, error) {
	if sc := s.schema.Load(); sc != nil {
		return sc, nil
	}
	s.schemaMu.Lock()
	defer s.schemaMu.Unlock()
	if sc := s.schema.Load(); sc != nil {
		return sc, nil
	}
	sc, err := detectSchema(ctx, s.pool)
	if err != nil {
		return nil, err
	}
	s.schema.Store(sc)
	if sc.jsonBody() {
		s.logger.Info("idem: idempotency_keys.response_body is JSON (the article's schema): responses are the stored JSON's text, not byte for byte, until `idemctl migrate --adopt-article-schema` (docs/operations.md)",
			"response_body", sc.body, "max_key_length", sc.maxKey)
	} else if sc.maxKey != MaxKeyLength {
		s.logger.Info("idem: idempotency_key is narrower than idemd's schema; longer keys get 400", "max_key_length", sc.maxKey)
	}
	return sc, nil
}

// MaxKeyLength returns the longest key the store accepts: MaxKeyLength on
// idemd's schema, less when the database's idempotency_key column is
// narrower (100 on the article's schema). It is 0 until the store has read
// the schema (Open does at once, New on first use).
func (s *Store) MaxKeyLength() int {
	if sc := s.schema.Load(); sc != nil {
		return sc.maxKey
	}
	return 0
}

// validateKey is ValidateKey plus the column's own limit, checked before
// any query touches the key.
func (s *Store) validateKey(ctx context.Context, key string) error {
	if err := ValidateKey(key); err != nil {
		return err
	}
	sc, err := s.schemaFor(ctx)
	if err != nil {
		return err
	}
	if utf8.RuneCountInString(key) > sc.maxKey {
		return fmt.Errorf("%w: at most %d characters", ErrKeyTooLong, sc.maxKey)
	}
	return nil
}

// storableBody decides what a Response body is stored as on sc:
//
//   - on text (idemd's schema) the body itself, byte for byte;
//   - on jsonb/json an empty body is stored as NULL (replayed empty), a
//     body that is a JSON document the column can hold is stored as that
//     document, and any other body (plain text, or JSON with a \u0000
//     escape, which jsonb refuses) as a JSON string of its text, so the
//     phase commits instead of failing with 22P02.
//
// A body that is not UTF-8 text without NUL bytes is ErrResponseBody on
// every schema: no text column can hold it.
func storableBody(sc *schema, body []byte) (*string, error) {
	if !utf8.Valid(body) || containsNUL(body) {
		return nil, ErrResponseBody
	}
	s := string(body)
	switch {
	case !sc.jsonBody():
	case len(body) == 0:
		return nil, nil
	case !jsonStorable(body, sc.body == bodyJSONB):
		s = jsonString(s)
	}
	return &s, nil
}

func containsNUL(b []byte) bool {
	for _, c := range b {
		if c == 0 {
			return true
		}
	}
	return false
}

// jsonStorable reports whether body is one JSON document the column takes
// as it is: any valid JSON for json, and for jsonb one without a \u0000
// escape (jsonb cannot hold NUL in a string).
func jsonStorable(body []byte, jsonb bool) bool {
	if !json.Valid(body) {
		return false
	}
	if !jsonb {
		return true
	}
	// In valid JSON a backslash only appears inside a string, starting an
	// escape; skip each escaped character so "\\u0000" (an escaped
	// backslash, then text) is not taken for one.
	for i := 0; i < len(body); i++ {
		if body[i] != '\\' {
			continue
		}
		if i+5 < len(body) && body[i+1] == 'u' && string(body[i+2:i+6]) == "0000" {
			return false
		}
		i++
	}
	return true
}

// jsonString encodes s as a JSON string without HTML escaping.
func jsonString(s string) string {
	var b strings.Builder
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(s) // a string always encodes
	return strings.TrimSuffix(b.String(), "\n")
}
