package clients

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/idemd/idemd/idem/replayauth"
	"github.com/idemd/idemd/internal/testing/replaytest"
	"github.com/idemd/idemd/internal/testing/replayvectors"
)

// vectorsPath is the published vectors file, relative to this package.
var vectorsPath = filepath.Join("..", "idem", "replayauth", "testdata", "vectors.json")

type (
	vector  = replayvectors.Vector
	step    = replayvectors.Step
	request = replayvectors.Request
)

const (
	secretA = "0123456789abcdef0123456789abcdef"
	secretB = "fedcba9876543210fedcba9876543210"
	// secretX is nobody's: a forger's guess.
	secretX = "an attacker's guess at the secret!"
	skew    = int64(replayauth.DefaultSkew / 1e9)
)

func sec(t *testing.T, raw string) replayauth.Secret {
	t.Helper()
	s, err := replayauth.NewSecret([]byte(raw))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// build is one vector under construction.
type build struct {
	t *testing.T
	v vector
}

func (b *build) req() replayauth.Request {
	return replayauth.Request{Method: b.v.Method, Path: b.v.Path, UserID: b.v.UserID, IdempotencyKey: b.v.Key, Body: []byte(b.v.Body)}
}

func (b *build) signed() request {
	return request{Method: b.v.Method, Path: b.v.Path, Key: b.v.Key, Body: b.v.Body}
}

// sign returns the header the vector's secrets give r at ts with nonce.
func (b *build) sign(ts int64, nonce string, r replayauth.Request, secrets ...string) string {
	if len(secrets) == 0 {
		secrets = b.v.Secrets
	}
	raw := make([][]byte, len(secrets))
	for i, sec := range secrets {
		raw[i] = []byte(sec)
	}
	return replaytest.SignAt(ts, nonce, r, raw...)
}

func (b *build) step(now float64, header string, r request, expect string) *build {
	s := step{Now: now, Header: header, Request: r, Expect: expect}
	if expect == "ok" {
		s.UserID = strconv.FormatInt(b.v.UserID, 10)
	}
	b.v.Steps = append(b.v.Steps, s)
	return b
}

// at is a step at the vector's own timestamp with the signed request.
func (b *build) at(header, expect string) *build {
	return b.step(float64(b.v.Timestamp), header, b.signed(), expect)
}

// newVector signs the base request with secrets at ts.
func newVector(t *testing.T, name string, ts int64, nonce string, secrets ...string) *build {
	b := &build{t: t, v: vector{
		Name: name, Secrets: secrets, Timestamp: ts, Nonce: nonce,
		Method: "POST", Path: "/orders", UserID: 42, Key: "order-key-0001",
		Body: `{"quantity":2,"sku":"book"}`, Skew: skew,
	}}
	b.v.VerifierSecrets = secrets
	return b
}

func (b *build) finish() vector {
	r := b.req()
	b.v.Canonical = replayauth.Canonical(b.v.Timestamp, b.v.Nonce, r)
	b.v.Header = b.sign(b.v.Timestamp, b.v.Nonce, r)
	if b.v.VerifierSecrets == nil {
		b.v.VerifierSecrets = b.v.Secrets
	}
	if b.v.Skew == 0 {
		b.v.Skew = skew
	}
	if len(b.v.Steps) == 0 {
		b.at(b.v.Header, "ok")
	}
	return b.v
}

// generate returns every vector. The first three are the original
// acceptance vectors, unchanged; the rest pin every refusal of Verify.
func generate(t *testing.T) []vector {
	var out []vector
	add := func(b *build) { out = append(out, b.finish()) }

	// The original vectors.
	add(&build{t: t, v: vector{Name: "json body", Secrets: []string{secretA}, Timestamp: 1767225600,
		Nonce: "6f1c2a9e0d4b4c8f9a3e1b2c3d4e5f60", Method: "POST", Path: "/rides", UserID: 42,
		Key: "0d3f7a4e-5b1c-4c2a-9e8f-1a2b3c4d5e6f", Body: `{"origin_lat":0.0,"origin_lon":0.0,"target_lat":1.0,"target_lon":1.0}`}})
	add(&build{t: t, v: vector{Name: "empty body, lower-case method", Secrets: []string{secretA}, Timestamp: 1767225601,
		Nonce: "aa", Method: "post", Path: "/rides", UserID: 1, Key: "k"}})
	add(&build{t: t, v: vector{Name: "rotation: two secrets", Secrets: []string{secretA, secretB}, Timestamp: 1767225602,
		Nonce: "bb", Method: "POST", Path: "/charges", UserID: 9007199254740993, Key: "key with spaces", Body: "amount=100&currency=usd"}})

	const ts = int64(1767225700)
	base := func(name, nonce string) *build { return newVector(t, name, ts, nonce, secretA) }
	// hdr rebuilds the base's header from its parts, for malformed variants.
	parts := func(b *build) (tPart, nPart, uPart, v1 string) {
		h := b.sign(b.v.Timestamp, b.v.Nonce, b.req())
		f := strings.Split(h, ",")
		return f[0], f[1], f[2], f[3]
	}
	malformed := func(name, nonce string, header func(tp, np, up, v1 string) string) {
		b := base(name, nonce)
		tp, np, up, v1 := parts(b)
		add(b.at(header(tp, np, up, v1), "malformed"))
	}
	accepted := func(name, nonce string, header func(tp, np, up, v1 string) string) {
		b := base(name, nonce)
		tp, np, up, v1 := parts(b)
		add(b.at(header(tp, np, up, v1), "ok"))
	}

	// --- The header: missing and malformed.
	add(base("refused: missing header", "m0").at("", "missing"))
	malformed("refused: not key=value", "m1", func(_, _, _, _ string) string { return "hello" })
	malformed("refused: no v1", "m2", func(tp, np, up, _ string) string { return tp + "," + np + "," + up })
	malformed("refused: no t", "m3", func(_, np, up, v1 string) string { return np + "," + up + "," + v1 })
	malformed("refused: no n", "m4", func(tp, _, up, v1 string) string { return tp + "," + up + "," + v1 })
	malformed("refused: no u", "m5", func(tp, np, _, v1 string) string { return tp + "," + np + "," + v1 })
	malformed("refused: v1 too short", "m6", func(tp, np, up, _ string) string { return tp + "," + np + "," + up + ",v1=abcd" })
	malformed("refused: v1 one byte too long", "m7", func(tp, np, up, v1 string) string { return tp + "," + np + "," + up + "," + v1 + "00" })
	malformed("refused: v1 not hex", "m8", func(tp, np, up, v1 string) string {
		return tp + "," + np + "," + up + ",v1=" + strings.Repeat("zz", 32)
	})
	malformed("refused: v1 with a space inside", "m9", func(tp, np, up, v1 string) string {
		return tp + "," + np + "," + up + "," + v1[:10] + " " + v1[11:]
	})
	malformed("refused: odd number of hex digits", "m10", func(tp, np, up, v1 string) string { return tp + "," + np + "," + up + "," + v1 + "0" })
	malformed("refused: t twice", "m11", func(tp, np, up, v1 string) string { return tp + "," + tp + "," + np + "," + up + "," + v1 })
	malformed("refused: n twice", "m12", func(tp, np, up, v1 string) string { return tp + "," + np + "," + np + "," + up + "," + v1 })
	malformed("refused: u twice", "m13", func(tp, np, up, v1 string) string { return tp + "," + np + "," + up + "," + up + "," + v1 })
	malformed("refused: t not an integer", "m14", func(_, np, up, v1 string) string {
		return fmt.Sprintf("t=%d.0,%s,%s,%s", ts, np, up, v1)
	})
	malformed("refused: t empty", "m15", func(_, np, up, v1 string) string { return "t=," + np + "," + up + "," + v1 })
	malformed("refused: t beyond int64", "m16", func(_, np, up, v1 string) string {
		return "t=9223372036854775808," + np + "," + up + "," + v1
	})
	malformed("refused: u not an integer", "m17", func(tp, np, _, v1 string) string { return tp + "," + np + ",u=42x," + v1 })
	malformed("refused: u beyond int64", "m18", func(tp, np, _, v1 string) string {
		return tp + "," + np + ",u=9223372036854775808," + v1
	})
	malformed("refused: u with a space inside", "m19", func(tp, np, _, v1 string) string { return tp + "," + np + ",u=4 2," + v1 })
	malformed("refused: empty nonce", "m20", func(tp, _, up, v1 string) string { return tp + ",n=," + up + "," + v1 })
	{
		n65 := strings.Repeat("n", 65)
		b := base("refused: nonce of 65 characters", n65)
		add(b.at(b.sign(ts, n65, b.req()), "malformed"))
	}
	malformed("refused: trailing comma", "m21", func(tp, np, up, v1 string) string { return tp + "," + np + "," + up + "," + v1 + "," })
	malformed("refused: a part without =", "m22", func(tp, np, up, v1 string) string { return tp + "," + np + "," + up + "," + v1 + ",junk" })
	malformed("refused: five v1 values, one of them right", "m23", func(tp, np, up, v1 string) string {
		other := "v1=" + strings.Repeat("00", 32)
		return strings.Join([]string{tp, np, up, other, other, other, other, v1}, ",")
	})
	{
		// A key or path with a newline could forge the canonical string's
		// field boundaries: refused before any MAC, even a valid one.
		b := base("refused: idempotency key with a newline", "m24")
		b.v.Key = "order-key\n0001"
		add(b.at(b.sign(ts, "m24", b.req()), "malformed"))
		b = base("refused: path with a carriage return", "m25")
		b.v.Path = "/orders\r"
		add(b.at(b.sign(ts, "m25", b.req()), "malformed"))
	}
	{
		// Malformed is decided before the window: the header is not even
		// read as a timestamp.
		b := base("refused: malformed and expired is malformed", "m26")
		tp, np, up, _ := parts(b)
		b.step(float64(ts+skew+100), tp+","+np+","+up+",v1=abcd", b.signed(), "malformed")
		add(b)
	}

	// --- Headers read the way Go reads them, accepted.
	accepted("accepted: spaces around the parts", "a1", func(tp, np, up, v1 string) string {
		return " " + tp + " , " + np + ",\t" + up + " ,  " + v1 + " "
	})
	accepted("accepted: parts in another order", "a2", func(tp, np, up, v1 string) string { return v1 + "," + up + "," + np + "," + tp })
	accepted("accepted: upper-case hex", "a3", func(tp, np, up, v1 string) string { return tp + "," + np + "," + up + ",v1=" + strings.ToUpper(v1[3:]) })
	accepted("accepted: unknown schemes ignored", "a4", func(tp, np, up, v1 string) string {
		return tp + "," + np + "," + up + ",v2=whatever,v0=," + v1 + ",=x"
	})
	accepted("accepted: four v1 values, one of them right", "a5", func(tp, np, up, v1 string) string {
		other := "v1=" + strings.Repeat("00", 32)
		return strings.Join([]string{tp, np, up, other, other, other, v1}, ",")
	})
	accepted("accepted: u with a plus sign and a leading zero is the same number", "a6", func(tp, np, _, v1 string) string {
		return tp + "," + np + ",u=+042," + v1
	})
	accepted("accepted: t with a plus sign", "a7", func(_, np, up, v1 string) string {
		return fmt.Sprintf("t=+%d,%s,%s,%s", ts, np, up, v1)
	})
	{
		n64 := strings.Repeat("n", 64)
		b := base("accepted: nonce of 64 characters", n64)
		add(b.at(b.sign(ts, n64, b.req()), "ok"))
	}
	{
		b := base("accepted: nonce with = in it", "a=b")
		add(b.at(b.sign(ts, "a=b", b.req()), "ok"))
	}
	{
		// The method is upper-cased into the canonical string: the
		// verifier's request method may be spelled either way.
		b := base("accepted: method in lower case at the verifier", "a8")
		r := b.signed()
		r.Method = "post"
		add(b.step(float64(ts), b.sign(ts, "a8", b.req()), r, "ok"))
	}
	{
		b := base("accepted: UTF-8 path, key and body", "a9")
		b.v.Path, b.v.Key, b.v.Body = "/orders/café", "clé-✓", `{"note":"naïve ✓"}`
		add(b.at(b.sign(ts, "a9", b.req()), "ok"))
	}
	{
		b := base("accepted: negative user id", "a10")
		b.v.UserID = -7
		add(b.at(b.sign(ts, "a10", b.req()), "ok"))
	}
	{
		b := base("accepted: largest user id", "a11")
		b.v.UserID = 9223372036854775807
		add(b.at(b.sign(ts, "a11", b.req()), "ok"))
	}

	// --- The MAC.
	{
		b := base("refused: signed with another secret", "s1")
		add(b.at(b.sign(ts, "s1", b.req(), secretX), "mismatch"))
	}
	for _, c := range []struct {
		name  string
		alter func(*request)
	}{
		{"refused: body altered", func(r *request) { r.Body = `{"quantity":3,"sku":"book"}` }},
		{"refused: body emptied", func(r *request) { r.Body = "" }},
		{"refused: path altered", func(r *request) { r.Path = "/orders/2" }},
		{"refused: path with a query string", func(r *request) { r.Path = "/orders?x=1" }},
		{"refused: idempotency key altered", func(r *request) { r.Key = "order-key-0002" }},
		{"refused: method altered", func(r *request) { r.Method = "PUT" }},
	} {
		nonce := fmt.Sprintf("s%d", len(out))
		b := base(c.name, nonce)
		r := b.signed()
		c.alter(&r)
		add(b.step(float64(ts), b.sign(ts, nonce, b.req()), r, "mismatch"))
	}
	{
		b := base("refused: user mismatch (u altered)", "s2")
		tp, np, _, v1 := parts(b)
		add(b.at(tp+","+np+",u=43,"+v1, "mismatch"))
	}
	{
		b := base("refused: timestamp altered within the window", "s3")
		_, np, up, v1 := parts(b)
		add(b.at(fmt.Sprintf("t=%d,%s,%s,%s", ts-1, np, up, v1), "mismatch"))
	}
	{
		b := base("refused: nonce altered", "s4")
		tp, _, up, v1 := parts(b)
		add(b.at(tp+",n=s5,"+up+","+v1, "mismatch"))
	}
	{
		b := base("refused: v1 of another request", "s6")
		other := b.req()
		other.IdempotencyKey = "order-key-0002"
		h := b.sign(ts, "s6", other)
		tp, np, up, _ := parts(b)
		add(b.at(tp+","+np+","+up+h[strings.Index(h, ",v1="):], "mismatch"))
	}

	// --- The window (|now - t| <= skew), at its edges.
	for _, c := range []struct {
		name   string
		now    float64
		expect string
	}{
		{"accepted: window edge, signed skew seconds ago", float64(ts + skew), "ok"},
		{"accepted: window edge, signed skew seconds ahead", float64(ts - skew), "ok"},
		{"refused: expired, signed skew + 1 seconds ago", float64(ts + skew + 1), "expired"},
		{"refused: future, signed skew + 1 seconds ahead", float64(ts - skew - 1), "expired"},
		{"refused: expired by half a second", float64(ts+skew) + 0.5, "expired"},
		{"accepted: half a second inside the window", float64(ts+skew) - 0.5, "ok"},
	} {
		nonce := fmt.Sprintf("w%d", len(out))
		b := base(c.name, nonce)
		add(b.step(c.now, b.sign(ts, nonce, b.req()), b.signed(), c.expect))
	}
	{
		b := base("refused: expired with a forged MAC is expired (window before MAC)", "w1")
		add(b.step(float64(ts+skew+1), b.sign(ts, "w1", b.req(), secretX), b.signed(), "expired"))
	}
	{
		b := base("refused: a verifier's own window of 60 s", "w2")
		b.v.Skew = 60
		h := b.sign(ts, "w2", b.req())
		b.step(float64(ts+60), h, b.signed(), "ok")
		// The same header again past that window: expired, not replayed.
		b.step(float64(ts+61), h, b.signed(), "expired")
		add(b)
	}

	// --- Rotation: two secrets.
	{
		b := newVector(t, "rotation: verifier holds old and new, signer the new", ts, "r1", secretB)
		b.v.VerifierSecrets = []string{secretA, secretB}
		add(b)
		b = newVector(t, "rotation: verifier holds old and new, signer the old", ts, "r2", secretA)
		b.v.VerifierSecrets = []string{secretA, secretB}
		add(b)
		b = newVector(t, "rotation: signer holds both, verifier the old", ts, "r3", secretA, secretB)
		b.v.VerifierSecrets = []string{secretA}
		add(b)
		b = newVector(t, "rotation: signer holds both, verifier the new", ts, "r4", secretA, secretB)
		b.v.VerifierSecrets = []string{secretB}
		add(b)
		b = newVector(t, "rotation: signer holds both in the other order, verifier both", ts, "r5", secretB, secretA)
		b.v.VerifierSecrets = []string{secretA, secretB}
		add(b)
		b = newVector(t, "refused: rotation done, the old secret removed", ts, "r6", secretA)
		b.v.VerifierSecrets = []string{secretB}
		add(b.at(b.sign(ts, "r6", b.req()), "mismatch"))
		b = newVector(t, "refused: verifier holds two secrets, signed with a third", ts, "r7", secretX)
		b.v.VerifierSecrets = []string{secretA, secretB}
		add(b.at(b.sign(ts, "r7", b.req()), "mismatch"))
	}

	// --- Nonces: one store for the whole vector.
	{
		b := base("refused: replayed nonce", "n1")
		h := b.sign(ts, "n1", b.req())
		b.at(h, "ok").step(float64(ts+1), h, b.signed(), "replayed")
		add(b)
	}
	{
		b := base("refused: a nonce reused for another request", "n2")
		other := b.req()
		other.IdempotencyKey = "order-key-0002"
		r := b.signed()
		r.Key = other.IdempotencyKey
		b.at(b.sign(ts, "n2", b.req()), "ok").step(float64(ts+2), b.sign(ts+2, "n2", other), r, "replayed")
		add(b)
	}
	{
		// One second before the window closes. (At the very instant
		// now = t + skew, Go's MemoryNonces already forgets the nonce
		// while the window still passes the signature; the vectors leave
		// that instant out, see docs/languages.)
		b := base("refused: replayed one second before the window closes", "n3")
		h := b.sign(ts, "n3", b.req())
		b.at(h, "ok").step(float64(ts+skew-1), h, b.signed(), "replayed")
		add(b)
	}
	{
		// A nonce is remembered until t + skew: a new signature with the
		// same nonce after that is fresh again.
		b := base("accepted: a nonce is fresh again once its signature expired", "n4")
		h := b.sign(ts, "n4", b.req())
		later := ts + skew + 1
		b.at(h, "ok").step(float64(later), b.sign(later, "n4", b.req()), b.signed(), "ok")
		add(b)
	}
	{
		// Only a valid signature records its nonce.
		b := base("accepted: a forged header does not use up its nonce", "n5")
		b.at(b.sign(ts, "n5", b.req(), secretX), "mismatch").at(b.sign(ts, "n5", b.req()), "ok")
		add(b)
	}
	{
		b := base("accepted: an expired header does not use up its nonce", "n6")
		old := ts - skew - 10
		b.at(b.sign(old, "n6", b.req()), "expired").at(b.sign(ts, "n6", b.req()), "ok")
		add(b)
	}
	return out
}

// encode writes vectors as the committed file is written: two-space
// indentation, no HTML escaping, a final newline.
func encode(vs []vector) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	if err := enc.Encode(vs); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// TestVectorsFile keeps the published vectors equal to what this package's
// generator makes with idem/replayauth. UPDATE_VECTORS=1 rewrites the file.
func TestVectorsFile(t *testing.T) {
	b, err := encode(generate(t))
	if err != nil {
		t.Fatal(err)
	}
	if os.Getenv("UPDATE_VECTORS") == "1" {
		if err := os.WriteFile(vectorsPath, b, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	have, err := os.ReadFile(vectorsPath)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(have, b) {
		t.Fatalf("%s is not what the generator makes; run UPDATE_VECTORS=1 go test ./clients -run TestVectorsFile", vectorsPath)
	}
}
