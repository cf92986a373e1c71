package idem_test

import (
	"encoding/json"
	"testing"

	"github.com/idemd/idemd/idem"
)

func TestCanonicalParamsSpellings(t *testing.T) {
	t.Parallel()
	// Each group is one logical document spelled differently: as a client,
	// Go's encoder, and PostgreSQL JSONB's output would write it.
	groups := [][]string{
		{`{"a":1,"b":2}`, `{ "b": 2, "a": 1 }`, `{"b":2.0,"a":1e0}`},
		{`{"x":0}`, `{"x":0.0}`, `{"x":-0}`, `{"x":0e10}`},
		{`{"lat":37.7749}`, `{"lat": 37.77490}`, `{"lat":3.77749e1}`},
		{`{"s":"<&>"}`, `{"s":"\u003c\u0026\u003e"}`},
		{`{"n":{"z":[1,2],"a":null}}`, `{"n":{"a":null,"z":[1.0,2]}}`},
	}
	for _, g := range groups {
		want, err := idem.CanonicalJSON([]byte(g[0]))
		if err != nil {
			t.Fatal(err)
		}
		for _, v := range g[1:] {
			got, err := idem.CanonicalJSON([]byte(v))
			if err != nil {
				t.Fatalf("%s: %v", v, err)
			}
			if string(got) != string(want) {
				t.Errorf("%s -> %s, want %s", v, got, want)
			}
		}
	}
}

func TestCanonicalParamsDistinguishes(t *testing.T) {
	t.Parallel()
	pairs := [][2]string{
		{`{"a":1}`, `{"a":2}`},
		{`{"a":1}`, `{"a":"1"}`},
		{`{"a":1.5}`, `{"a":1.25}`},
		{`{"a":1}`, `{"b":1}`},
		{`{"a":null}`, `{}`},
	}
	for _, p := range pairs {
		a, _ := idem.CanonicalJSON([]byte(p[0]))
		b, _ := idem.CanonicalJSON([]byte(p[1]))
		if string(a) == string(b) {
			t.Errorf("%s and %s share canonical form %s", p[0], p[1], a)
		}
	}
}

func TestFingerprintCoversMethodAndPath(t *testing.T) {
	t.Parallel()
	p := []byte(`{}`)
	base := idem.Fingerprint("POST", "/rides", p)
	if idem.Fingerprint("post", "/rides", p) != base {
		t.Error("method case must not matter")
	}
	for _, other := range []string{
		idem.Fingerprint("PUT", "/rides", p),
		idem.Fingerprint("POST", "/rides/1", p),
		idem.Fingerprint("POST", "/rides", []byte(`{"a":1}`)),
	} {
		if other == base {
			t.Error("fingerprint ignores a component")
		}
	}
}

// FuzzCanonicalJSON: canonicalisation is idempotent, its output is valid
// JSON that means the same document, and the fingerprint depends only on the
// canonical form.
func FuzzCanonicalJSON(f *testing.F) {
	for _, s := range []string{
		`{"origin_lat":0,"origin_lon":0,"target_lat":0,"target_lon":0}`,
		`{"a":[1,2.5,"x",null,true,{"b":-0.0}]}`, `{"big":123456789012345678901234567890}`,
		`{"tiny":1e-400}`, `{"u":"\u00e9\ud83d\ude00"}`, `[]`, `"s"`, `1e308`, `{"k":"<>&\u2028"}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, doc []byte) {
		c1, err := idem.CanonicalJSON(doc)
		if err != nil {
			return
		}
		if !json.Valid(c1) {
			t.Fatalf("canonical form is not JSON: %q", c1)
		}
		c2, err := idem.CanonicalJSON(c1)
		if err != nil {
			t.Fatalf("canonical form does not re-canonicalise: %q: %v", c1, err)
		}
		if string(c1) != string(c2) {
			t.Fatalf("not idempotent: %q -> %q", c1, c2)
		}
		if idem.Fingerprint("POST", "/x", c1) != idem.Fingerprint("POST", "/x", c2) {
			t.Fatal("fingerprint unstable")
		}
	})
}
