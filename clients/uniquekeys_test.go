package clients

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivertype"

	"github.com/idemd/idemd/clients/clienttest"
	"github.com/idemd/idemd/internal/enqueuer"
	"github.com/idemd/idemd/internal/testing/dbtest"
)

// uniqueVectorsPath is the published unique-key vectors file, relative to
// this package: what every language's unique_key helper is checked against.
var uniqueVectorsPath = filepath.Join("testdata", "unique_keys.json")

// uniqueVector is one entry of the file (docs/languages/README.md, "Unique
// jobs from another language").
type uniqueVector struct {
	Name  string `json:"name"`
	Kind  string `json:"kind"`
	Queue string `json:"queue"`
	// Args is the job's args as the other languages write them: a float is
	// written with a fraction or an exponent (1.0, -0.0, 1e21), so that
	// their JSON parsers read a float, as Go's float64 field holds one.
	Args   json.RawMessage `json:"args"`
	Unique uniqueSpec      `json:"unique"`
	// At is the instant the period is taken from: the job's scheduled_at,
	// or the insert's now.
	At           string `json:"at"`
	KeyString    string `json:"key_string"`
	UniqueKey    string `json:"unique_key"`    // hex of SHA-256(key_string)
	UniqueStates string `json:"unique_states"` // bit(8) as PostgreSQL prints it
}

// uniqueSpec is River's UniqueOpts in the form the helpers take.
type uniqueSpec struct {
	ByArgs bool `json:"by_args,omitempty"`
	// Fields are the args marked `river:"unique"` as JSON paths (a.b is
	// field b of object a); none means all of the args.
	Fields      []string `json:"fields,omitempty"`
	ByPeriod    int64    `json:"by_period,omitempty"` // seconds
	ByQueue     bool     `json:"by_queue,omitempty"`
	ByState     []string `json:"by_state,omitempty"`
	ExcludeKind bool     `json:"exclude_kind,omitempty"`
}

// uniqueCase is a vector as Go's API would insert it: goArgs is the args
// value River's InsertTx is given (nil: Args decoded into Go values, an
// object keeping its order as a struct's fields do).
type uniqueCase struct {
	name, kind, queue string
	args              string
	goArgs            river.JobArgs
	opts              river.UniqueOpts
	fields            []string
	at                time.Time
	// scheduled: at is the job's InsertOpts.ScheduledAt, and the insert's
	// now is two days earlier.
	scheduled bool
}

// Args types with fields marked unique, as an API declares them.
type (
	ukInvoiceArgs struct {
		CustomerID int64   `json:"customer_id" river:"unique"`
		Month      string  `json:"month"       river:"unique"`
		Region     string  `json:"region,omitempty" river:"unique"`
		Note       string  `json:"note"`
		Amount     float64 `json:"amount"`
	}
	ukShipArgs struct {
		Order    int64          `json:"order"`
		Customer ukShipCustomer `json:"customer"`
		AB       string         `json:"a-b" river:"unique"`
		Lines    []ukLine       `json:"lines" river:"unique"`
	}
	ukShipCustomer struct {
		Name string `json:"name"`
		ID   int64  `json:"id"   river:"unique"`
		Zip  string `json:"zip"  river:"unique"`
	}
	ukLine struct {
		SKU string  `json:"sku"`
		Qty float64 `json:"qty"`
	}
)

func (ukInvoiceArgs) Kind() string { return "uk_invoice" }
func (ukShipArgs) Kind() string    { return "uk_ship" }

// literalArgs are a vector's args decoded into Go values.
type literalArgs struct {
	kind string
	obj  orderedObject
}

func (a literalArgs) Kind() string                 { return a.kind }
func (a literalArgs) MarshalJSON() ([]byte, error) { return json.Marshal(a.obj) }

// orderedObject is a JSON object whose fields encode in the order given,
// as a struct's do; each value is encoded by encoding/json.
type orderedObject struct {
	keys []string
	vals []any
}

func (o orderedObject) MarshalJSON() ([]byte, error) {
	var b bytes.Buffer
	b.WriteByte('{')
	for i, k := range o.keys {
		if i > 0 {
			b.WriteByte(',')
		}
		kb, err := json.Marshal(k)
		if err != nil {
			return nil, err
		}
		vb, err := json.Marshal(o.vals[i])
		if err != nil {
			return nil, err
		}
		b.Write(kb)
		b.WriteByte(':')
		b.Write(vb)
	}
	b.WriteByte('}')
	return b.Bytes(), nil
}

// decodeLiteral reads a vector's args into the Go values an API's args
// struct would hold: a number with a fraction or an exponent is a float64,
// any other an int64; objects keep their order.
func decodeLiteral(s string) (any, error) {
	d := json.NewDecoder(strings.NewReader(s))
	d.UseNumber()
	v, err := decodeValue(d)
	if err != nil {
		return nil, err
	}
	if _, err := d.Token(); !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("decode args: trailing data in %s", s)
	}
	return v, nil
}

func decodeValue(d *json.Decoder) (any, error) {
	tok, err := d.Token()
	if err != nil {
		return nil, fmt.Errorf("decode args: %w", err)
	}
	switch t := tok.(type) {
	case json.Delim:
		switch t {
		case '{':
			var o orderedObject
			for d.More() {
				kt, err := d.Token()
				if err != nil {
					return nil, fmt.Errorf("decode args: %w", err)
				}
				v, err := decodeValue(d)
				if err != nil {
					return nil, err
				}
				o.keys = append(o.keys, kt.(string))
				o.vals = append(o.vals, v)
			}
			_, err := d.Token()
			return o, err
		case '[':
			a := []any{}
			for d.More() {
				v, err := decodeValue(d)
				if err != nil {
					return nil, err
				}
				a = append(a, v)
			}
			_, err := d.Token()
			return a, err
		}
		return nil, fmt.Errorf("decode args: unexpected %v", t)
	case json.Number:
		if strings.ContainsAny(string(t), ".eE") {
			return strconv.ParseFloat(string(t), 64)
		}
		return strconv.ParseInt(string(t), 10, 64)
	default:
		return t, nil // string, bool, nil
	}
}

// goArgsOf is what River's InsertTx is given for c.
func goArgsOf(t *testing.T, c uniqueCase) river.JobArgs {
	t.Helper()
	v, err := decodeLiteral(c.args)
	if err != nil {
		t.Fatalf("%s: %v", c.name, err)
	}
	obj, ok := v.(orderedObject)
	if !ok {
		t.Fatalf("%s: args must be an object", c.name)
	}
	lit := literalArgs{kind: c.kind, obj: obj}
	if c.goArgs == nil {
		return lit
	}
	// The literal the other languages read must be the struct's args.
	want, err1 := json.Marshal(lit)
	have, err2 := json.Marshal(c.goArgs)
	if err1 != nil || err2 != nil || !bytes.Equal(want, have) {
		t.Fatalf("%s: args %s are not the struct's %s (%v, %v)", c.name, want, have, err1, err2)
	}
	if c.goArgs.Kind() != c.kind {
		t.Fatalf("%s: kind %q, the struct's %q", c.name, c.kind, c.goArgs.Kind())
	}
	return c.goArgs
}

var (
	ukAt       = time.Date(2026, 12, 6, 10, 17, 23, 456789000, time.UTC)
	ukByArgs   = river.UniqueOpts{ByArgs: true}
	ukDefaults = []rivertype.JobState{
		rivertype.JobStateAvailable, rivertype.JobStateCompleted, rivertype.JobStatePending,
		rivertype.JobStateRetryable, rivertype.JobStateRunning, rivertype.JobStateScheduled,
	}
)

// uniqueCases are the published vectors, as Go's API inserts them.
func uniqueCases() []uniqueCase {
	week := 7 * 24 * time.Hour
	all := []rivertype.JobState{
		rivertype.JobStateAvailable, rivertype.JobStateCancelled, rivertype.JobStateCompleted, rivertype.JobStateDiscarded,
		rivertype.JobStatePending, rivertype.JobStateRetryable, rivertype.JobStateRunning, rivertype.JobStateScheduled,
	}
	required := []rivertype.JobState{
		rivertype.JobStateAvailable, rivertype.JobStatePending, rivertype.JobStateRunning, rivertype.JobStateScheduled,
	}
	c := func(name, kind, args string, opts river.UniqueOpts) uniqueCase {
		return uniqueCase{name: name, kind: kind, queue: "default", args: args, opts: opts, at: ukAt}
	}
	cs := []uniqueCase{
		c("by args: plain ASCII, keys sorted", "uk_plain", `{"b":2,"a":"x","c":true,"d":null}`, ukByArgs),
		c("by args: & < > escaped in values as Go's encoding/json does", "uk_html",
			`{"q":"a&b<c>d","url":"https://example.com/?a=1&b=2","tag":"<script>"}`, ukByArgs),
		c("by args: & < > in top-level ASCII keys stay raw", "uk_html_keys", `{"a&b":1,"x<y>":2}`, ukByArgs),
		c("by args: a top-level key with a non-ASCII byte is escaped as Go does, & included", "uk_key_unicode",
			`{"é&":1,"ü":2,"plain":3}`, ukByArgs),
		c("by args: quote, backslash and control characters", "uk_control",
			"{\"s\":\"quote\\\" backslash\\\\ tab\\t nl\\n cr\\r bs\\b ff\\f soh\\u0001 us\\u001f del\\u007f slash/\"}", ukByArgs),
		c("by args: unicode: BMP, non-BMP, U+2028 and U+2029", "uk_unicode",
			"{\"bmp\":\"héllo wörld €\",\"astral\":\"😀 𝄞\",\"seps\":\"a\\u2028b\\u2029c\"}", ukByArgs),
		c("by args: floats as Go's float64 encodes them", "uk_floats",
			`{"one":1.0,"big":1e21,"below_big":1e20,"neg_zero":-0.0,"tenth":0.1,"third":0.3333333333333333,"tiny":1e-7,"small":0.000001,"huge":1.5e300,"neg":-2.5,"max":1.7976931348623157e308,"min":5e-324}`, ukByArgs),
		c("by args: integers", "uk_ints", `{"zero":0,"neg":-42,"max":9223372036854775807,"min":-9223372036854775808}`, ukByArgs),
		c("by args: nested objects keep their order, only the top level is sorted", "uk_nested",
			`{"z":{"y":1,"x":[{"b":1.0,"a":"&"}]},"a":[],"m":{}}`, ukByArgs),
		c("by args: empty args", "uk_empty", `{}`, ukByArgs),
		c("kind only: not by args", "uk_kind_only", `{"ignored":"by the key"}`, river.UniqueOpts{ByQueue: false, ByState: ukDefaults}),
		{name: "by queue", kind: "uk_queue", queue: "billing", args: `{"n":1}`, opts: river.UniqueOpts{ByArgs: true, ByQueue: true}, at: ukAt},
		{name: "by queue without args", kind: "uk_queue_only", queue: "mail_2", args: `{"n":1}`, opts: river.UniqueOpts{ByQueue: true}, at: ukAt},
		c("by period: an hour", "uk_hour", `{"n":1}`, river.UniqueOpts{ByArgs: true, ByPeriod: time.Hour}),
		c("by period: 90 minutes", "uk_90m", `{"n":1}`, river.UniqueOpts{ByPeriod: 90 * time.Minute}),
		c("by period: a day", "uk_day", `{"n":1}`, river.UniqueOpts{ByPeriod: 24 * time.Hour}),
		c("by period: a week counts from Go's zero time (a Monday), not from 1970", "uk_week", `{"n":1}`, river.UniqueOpts{ByPeriod: week}),
		c("by period: 7 seconds", "uk_7s", `{"n":1}`, river.UniqueOpts{ByPeriod: 7 * time.Second}),
		{name: "by period: an instant with another offset is taken in UTC", kind: "uk_offset", queue: "default", args: `{"n":1}`,
			opts: river.UniqueOpts{ByPeriod: time.Hour}, at: ukAt.In(time.FixedZone("", -(9*3600 + 30*60)))},
		{name: "by period: before 1970", kind: "uk_old", queue: "default", args: `{"n":1}`,
			opts: river.UniqueOpts{ByPeriod: week}, at: time.Date(1969, 7, 20, 20, 17, 40, 0, time.UTC)},
		{name: "by period: a scheduled job's period is its scheduled_at's, not the insert's", kind: "uk_scheduled", queue: "default",
			args: `{"n":1}`, opts: river.UniqueOpts{ByPeriod: time.Hour}, at: ukAt, scheduled: true},
		{name: "by args, period and queue", kind: "uk_all", queue: "billing", args: `{"customer_id":7,"month":"2026-12"}`,
			opts: river.UniqueOpts{ByArgs: true, ByPeriod: time.Hour, ByQueue: true}, at: ukAt},
		c("exclude kind: by args", "uk_nokind", `{"shared":"across kinds"}`, river.UniqueOpts{ByArgs: true, ExcludeKind: true}),
		c("by state: all eight states", "uk_state_all", `{"n":1}`, river.UniqueOpts{ByArgs: true, ByState: all}),
		c("by state: only the required four", "uk_state_req", `{"n":1}`, river.UniqueOpts{ByArgs: true, ByState: required}),
		c("by state: required and completed", "uk_state_completed", `{"n":1}`,
			river.UniqueOpts{ByArgs: true, ByState: append(slices.Clone(required), rivertype.JobStateCompleted)}),
		{name: "unique fields: the marked fields only, sorted", kind: "uk_invoice", queue: "default",
			args:   `{"customer_id":7,"month":"2026-12","region":"eu&uk","note":"<not unique>","amount":12.0}`,
			goArgs: ukInvoiceArgs{CustomerID: 7, Month: "2026-12", Region: "eu&uk", Note: "<not unique>", Amount: 12},
			opts:   ukByArgs, fields: []string{"customer_id", "month", "region"}, at: ukAt},
		{name: "unique fields: an omitted field (omitempty) is left out", kind: "uk_invoice", queue: "default",
			args:   `{"customer_id":7,"month":"2026-12","note":"","amount":0.5}`,
			goArgs: ukInvoiceArgs{CustomerID: 7, Month: "2026-12", Amount: 0.5},
			opts:   ukByArgs, fields: []string{"customer_id", "month", "region"}, at: ukAt},
		{name: "unique fields: nested fields by path, a whole array field", kind: "uk_ship", queue: "default",
			args: `{"order":3,"customer":{"name":"Zoë","id":11,"zip":"75<01"},"a-b":"x","lines":[{"sku":"book","qty":2.0},{"sku":"pen","qty":0.5}]}`,
			goArgs: ukShipArgs{Order: 3, Customer: ukShipCustomer{Name: "Zoë", ID: 11, Zip: "75<01"}, AB: "x",
				Lines: []ukLine{{SKU: "book", Qty: 2}, {SKU: "pen", Qty: 0.5}}},
			opts: river.UniqueOpts{ByArgs: true, ByPeriod: time.Hour}, fields: []string{"a-b", "customer.id", "customer.zip", "lines"}, at: ukAt},
	}
	return cs
}

// canonicalUniqueString is the string River's Go client hashes into
// unique_key, as docs/languages/README.md writes it down; TestUniqueVectorsAreRivers
// holds it to River's own insert.
func canonicalUniqueString(t *testing.T, c uniqueCase, encodedArgs []byte) string {
	t.Helper()
	var sb strings.Builder
	if !c.opts.ExcludeKind {
		sb.WriteString("&kind=" + c.kind)
	}
	if c.opts.ByArgs {
		sb.WriteString("&args=")
		if len(c.fields) == 0 {
			sb.Write(sortedTopLevel(t, encodedArgs))
		} else {
			sb.Write(selectedFields(t, encodedArgs, c.fields))
		}
	}
	if c.opts.ByPeriod > 0 {
		sb.WriteString("&period=" + c.at.Truncate(c.opts.ByPeriod).UTC().Format(time.RFC3339))
	}
	if c.opts.ByQueue {
		sb.WriteString("&queue=" + c.queue)
	}
	return sb.String()
}

// topLevelKey writes a top-level key: between quotes as it is when every
// byte is printable ASCII other than `"` and `\`, else as encoding/json
// writes a string.
func topLevelKey(k string) []byte {
	for i := range len(k) {
		if k[i] < 0x20 || k[i] > 0x7f || k[i] == '"' || k[i] == '\\' {
			b, _ := json.Marshal(k) //nolint:errchkjson // a string always encodes
			return b
		}
	}
	return []byte(`"` + k + `"`)
}

func sortedTopLevel(t *testing.T, encoded []byte) []byte {
	t.Helper()
	var m map[string]json.RawMessage
	if err := json.Unmarshal(encoded, &m); err != nil {
		t.Fatal(err)
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	b := []byte{'{'}
	for i, k := range keys {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, topLevelKey(k)...)
		b = append(b, ':')
		b = append(b, m[k]...)
	}
	return append(b, '}')
}

// selectedFields builds the object of the marked fields: paths in sorted
// order, each set (creating its parents) when present in the args.
func selectedFields(t *testing.T, encoded []byte, fields []string) []byte {
	t.Helper()
	type node struct {
		keys []string
		kids map[string]*node
		raw  map[string]json.RawMessage
	}
	root := &node{kids: map[string]*node{}, raw: map[string]json.RawMessage{}}
	sorted := slices.Clone(fields)
	slices.Sort(sorted)
	for _, f := range sorted {
		path := strings.Split(f, ".")
		raw := json.RawMessage(encoded)
		found := true
		for _, p := range path {
			var m map[string]json.RawMessage
			if json.Unmarshal(raw, &m) != nil {
				found = false
				break
			}
			if raw, found = m[p]; !found {
				break
			}
		}
		if !found {
			continue
		}
		n := root
		for _, p := range path[:len(path)-1] {
			kid, ok := n.kids[p]
			if !ok {
				kid = &node{kids: map[string]*node{}, raw: map[string]json.RawMessage{}}
				n.kids[p] = kid
				n.keys = append(n.keys, p)
			}
			n = kid
		}
		last := path[len(path)-1]
		n.keys = append(n.keys, last)
		n.raw[last] = raw
	}
	var write func(n *node) []byte
	write = func(n *node) []byte {
		b := []byte{'{'}
		for i, k := range n.keys {
			if i > 0 {
				b = append(b, ',')
			}
			b = append(b, `"`+k+`":`...)
			if kid, ok := n.kids[k]; ok {
				b = append(b, write(kid)...)
			} else {
				b = append(b, n.raw[k]...)
			}
		}
		return append(b, '}')
	}
	return write(root)
}

// uniqueStatesText is River's unique_states bitmask as PostgreSQL prints
// bit(8): scheduled, running, retryable, pending, discarded, completed,
// cancelled, available.
func uniqueStatesText(states []rivertype.JobState) string {
	if len(states) == 0 {
		states = ukDefaults
	}
	order := []rivertype.JobState{
		rivertype.JobStateScheduled, rivertype.JobStateRunning, rivertype.JobStateRetryable, rivertype.JobStatePending,
		rivertype.JobStateDiscarded, rivertype.JobStateCompleted, rivertype.JobStateCancelled, rivertype.JobStateAvailable,
	}
	b := []byte("00000000")
	for i, s := range order {
		if slices.Contains(states, s) {
			b[i] = '1'
		}
	}
	return string(b)
}

// uniqueVectors builds the published file's entries from uniqueCases.
func uniqueVectors(t *testing.T) []uniqueVector {
	t.Helper()
	var out []uniqueVector
	for _, c := range uniqueCases() {
		encoded, err := json.Marshal(goArgsOf(t, c))
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		ks := canonicalUniqueString(t, c, encoded)
		sum := sha256.Sum256([]byte(ks))
		var compact bytes.Buffer
		if err := json.Compact(&compact, []byte(c.args)); err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		spec := uniqueSpec{ByArgs: c.opts.ByArgs, Fields: c.fields, ByPeriod: int64(c.opts.ByPeriod / time.Second),
			ByQueue: c.opts.ByQueue, ExcludeKind: c.opts.ExcludeKind}
		if c.opts.ByPeriod%time.Second != 0 {
			t.Fatalf("%s: the vectors' periods are whole seconds", c.name)
		}
		for _, s := range c.opts.ByState {
			spec.ByState = append(spec.ByState, string(s))
		}
		out = append(out, uniqueVector{
			Name: c.name, Kind: c.kind, Queue: c.queue, Args: compact.Bytes(), Unique: spec,
			At: c.at.Format(time.RFC3339Nano), KeyString: ks, UniqueKey: hex.EncodeToString(sum[:]),
			UniqueStates: uniqueStatesText(c.opts.ByState),
		})
	}
	return out
}

// TestUniqueVectorsFile keeps clients/testdata/unique_keys.json equal to
// what uniqueCases make. UPDATE_VECTORS=1 rewrites the file.
func TestUniqueVectorsFile(t *testing.T) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	if err := enc.Encode(uniqueVectors(t)); err != nil {
		t.Fatal(err)
	}
	if os.Getenv("UPDATE_VECTORS") == "1" {
		if err := os.WriteFile(uniqueVectorsPath, buf.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	have, err := os.ReadFile(uniqueVectorsPath)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(have, buf.Bytes()) {
		t.Fatalf("%s is not what uniqueCases make; run UPDATE_VECTORS=1 go test ./clients -run TestUniqueVectorsFile", uniqueVectorsPath)
	}
}

// uniqueClock is River's test clock: each vector is inserted at its At.
type uniqueClock struct{ t time.Time }

func (c *uniqueClock) Now() time.Time       { return c.t }
func (c *uniqueClock) NowOrNil() *time.Time { return &c.t }

// loadUniqueVectors reads the published file.
func loadUniqueVectors(t *testing.T) []uniqueVector {
	t.Helper()
	b, err := os.ReadFile(uniqueVectorsPath)
	if err != nil {
		t.Fatal(err)
	}
	var vs []uniqueVector
	if err := json.Unmarshal(b, &vs); err != nil {
		t.Fatal(err)
	}
	if len(vs) != len(uniqueCases()) {
		t.Fatalf("%s has %d vectors, uniqueCases %d", uniqueVectorsPath, len(vs), len(uniqueCases()))
	}
	return vs
}

// insertUniqueWithRiver inserts every vector's job with River's own
// InsertTx and UniqueOpts, as a Go API does, and returns the unique_key
// and unique_states River wrote to river_job for each, read back from the
// table. With duplicates, every insert must be one River skips as a
// duplicate of a job already there.
func insertUniqueWithRiver(t *testing.T, dbURL string, duplicates bool) (keys, states []string) {
	t.Helper()
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	clock := &uniqueClock{}
	rc, err := river.NewClient(riverpgxv5.New(pool), &river.Config{Test: river.TestConfig{Time: clock}})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range uniqueCases() {
		clock.t = c.at
		opts := &river.InsertOpts{Queue: c.queue, UniqueOpts: c.opts}
		if c.scheduled {
			clock.t = c.at.Add(-48 * time.Hour)
			opts.ScheduledAt = c.at
		}
		var res *rivertype.JobInsertResult
		if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) (err error) {
			res, err = rc.InsertTx(ctx, tx, goArgsOf(t, c), opts)
			return err
		}); err != nil {
			t.Fatalf("%s: River's InsertTx: %v", c.name, err)
		}
		if res.UniqueSkippedAsDuplicate != duplicates {
			t.Fatalf("%s: River's InsertTx skipped it as a duplicate: %t, want %t", c.name, res.UniqueSkippedAsDuplicate, duplicates)
		}
		var key []byte
		var st string
		if err := pool.QueryRow(ctx, `SELECT unique_key, unique_states::text FROM river_job WHERE id = $1`, res.Job.ID).Scan(&key, &st); err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		keys = append(keys, hex.EncodeToString(key))
		states = append(states, st)
	}
	return keys, states
}

// TestUniqueVectorsAreRivers holds every published vector to River: the
// unique_key and unique_states River's own InsertTx writes to river_job
// for the vector's job, against PostgreSQL, are the file's, and the file's
// key_string hashes to that key.
func TestUniqueVectorsAreRivers(t *testing.T) {
	vs := loadUniqueVectors(t)
	keys, states := insertUniqueWithRiver(t, dbtest.NewDatabase(t), false)
	for i, v := range vs {
		sum := sha256.Sum256([]byte(v.KeyString))
		if hex.EncodeToString(sum[:]) != v.UniqueKey {
			t.Errorf("%s: key_string does not hash to unique_key", v.Name)
		}
		if keys[i] != v.UniqueKey {
			t.Errorf("%s: River's unique_key %s, the file's %s (key string %q)", v.Name, keys[i], v.UniqueKey, v.KeyString)
		}
		if states[i] != v.UniqueStates {
			t.Errorf("%s: River's unique_states %s, the file's %s", v.Name, states[i], v.UniqueStates)
		}
	}
}

// uniqueStaging checks, for one language, that a job staged with plain
// SQL and the language's unique_key helper is the job Go's InsertTx
// inserted, both ways round: River's jobs are inserted before the
// language's tests run (newUniqueStaging), the language's PostgreSQL test
// stages every vector into staged_jobs with its helper's key and states,
// and after it the enqueuer's move must write no new job (after). Then
// River's jobs are deleted, the language's rows staged again and moved,
// and River's InsertTx of every vector must find its job there.
type uniqueStaging struct {
	db   clienttest.DB
	keys []string
}

func newUniqueStaging(t *testing.T, db clienttest.DB) *uniqueStaging {
	t.Helper()
	keys, _ := insertUniqueWithRiver(t, db.URL, false)
	return &uniqueStaging{db: db, keys: keys}
}

func (u *uniqueStaging) after(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, u.db.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	var staged int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM staged_jobs WHERE job_name LIKE 'uk\_%' AND unique_key IS NOT NULL`).Scan(&staged); err != nil {
		t.Fatal(err)
	}
	if staged != len(u.keys) {
		t.Fatalf("the language staged %d unique rows, want one per vector (%d)", staged, len(u.keys))
	}
	// The language's rows, to stage again below.
	rows, err := pool.Query(ctx, `SELECT job_name, job_args::text, queue, unique_key, unique_states::text FROM staged_jobs WHERE job_name LIKE 'uk\_%' ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	type stagedRow struct {
		Kind, Args, Queue string
		Key               []byte
		States            string
	}
	languageRows, err := pgx.CollectRows(rows, pgx.RowToStructByPos[stagedRow])
	if err != nil {
		t.Fatal(err)
	}
	u.moveAndCount(t, pool, "Go's InsertTx, then the language's staged rows")

	if _, err := pool.Exec(ctx, `DELETE FROM river_job WHERE kind LIKE 'uk\_%'`); err != nil {
		t.Fatal(err)
	}
	for _, r := range languageRows {
		if _, err := pool.Exec(ctx, `INSERT INTO staged_jobs (job_name, job_args, queue, unique_key, unique_states) VALUES ($1, $2::jsonb, $3, $4, $5::bit(8))`,
			r.Kind, r.Args, r.Queue, r.Key, r.States); err != nil {
			t.Fatal(err)
		}
	}
	u.moveAndCount(t, pool, "the language's staged rows alone")
	insertUniqueWithRiver(t, u.db.URL, true)
	var jobs int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM river_job WHERE kind LIKE 'uk\_%'`).Scan(&jobs); err != nil || jobs != len(u.keys) {
		t.Fatalf("after River's InsertTx of the jobs the language staged first: %d River jobs for %d vectors (%v)", jobs, len(u.keys), err)
	}
}

// moveAndCount moves every staged row with the enqueuer and checks River
// holds one job per vector, each with Go's key.
func (u *uniqueStaging) moveAndCount(t *testing.T, pool *pgxpool.Pool, what string) {
	t.Helper()
	ctx := context.Background()
	s, err := enqueuer.New(enqueuer.Config{Settings: enqueuer.DefaultSettings(), Pool: pool})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.RunOnce(ctx); err != nil {
		t.Fatal(err)
	}
	var left, dead, jobs int
	if err := pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM staged_jobs), (SELECT count(*) FROM staged_jobs_dead),
	(SELECT count(*) FROM river_job WHERE kind LIKE 'uk\_%')`).Scan(&left, &dead, &jobs); err != nil {
		t.Fatal(err)
	}
	if left != 0 || dead != 0 {
		t.Fatalf("%s: after the move %d rows staged and %d dead, want 0 and 0", what, left, dead)
	}
	if jobs != len(u.keys) {
		t.Errorf("%s: %d River jobs for %d vectors: %d duplicates", what, jobs, len(u.keys), jobs-len(u.keys))
	}
	for i, v := range uniqueCases() {
		var n int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM river_job WHERE unique_key = decode($1, 'hex')`, u.keys[i]).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n != 1 {
			t.Errorf("%s: %s: %d River jobs with Go's unique key, want 1", what, v.name, n)
		}
	}
}
