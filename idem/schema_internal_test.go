package idem

import "testing"

// The forms pg_get_constraintdef prints for a bound on the key's length.
func TestCheckMaxLength(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		def  string
		want int
		ok   bool
	}{
		{"CHECK ((char_length(idempotency_key) <= 100))", 100, true},
		{"CHECK (((char_length(idempotency_key) >= 1) AND (char_length(idempotency_key) <= 255)))", 255, true},
		{"CHECK ((length(idempotency_key) < 65)) NOT VALID", 64, true},
		{"CHECK ((character_length((idempotency_key)::text) <= 80))", 80, true},
		{"CHECK ((40 >= char_length(idempotency_key)))", 40, true},
		{"CHECK (((char_length(idempotency_key) <= 200) AND (char_length(idempotency_key) < 150)))", 149, true},
		{"CHECK ((char_length(idempotency_key) >= 20))", 0, false},
		{"CHECK ((idempotency_key ~ '^[a-z]+$'::text))", 0, false},
		{"CHECK ((octet_length(idempotency_key) <= 100))", 0, false},
	} {
		got, ok := checkMaxLength(c.def)
		if got != c.want || ok != c.ok {
			t.Errorf("%s: %d %v, want %d %v", c.def, got, ok, c.want, c.ok)
		}
	}
}

func TestJSONStorable(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		body        string
		json, jsonb bool
	}{
		{`{"a":1}`, true, true},
		{`{"a":"\u0000"}`, true, false},
		{`{"a":"\\u0000"}`, true, true},
		{`{"a":"\\\u0000"}`, true, false},
		{`not json`, false, false},
		{``, false, false},
		{`{"a":1} {"b":2}`, false, false},
	} {
		if got := jsonStorable([]byte(c.body), false); got != c.json {
			t.Errorf("%s in json: %v", c.body, got)
		}
		if got := jsonStorable([]byte(c.body), true); got != c.jsonb {
			t.Errorf("%s in jsonb: %v", c.body, got)
		}
	}
}
