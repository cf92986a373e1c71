package riverdb

import (
	"bytes"
	"encoding/json"
	"go/ast"
	"go/constant"
	"go/parser"
	"go/token"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgtype"
)

// The staged-row rules, without a database: each row is judged by what it
// holds alone (validate.go mirrors River's checks so a bad row never fails
// its neighbours' COPY).
func TestValidatorCheck(t *testing.T) {
	str := func(s string) *string { return &s }
	i32 := func(v int32) *int32 { return &v }
	tags := func(ts ...*string) pgtype.Array[*string] {
		return pgtype.Array[*string]{Elements: ts, Dims: []pgtype.ArrayDimension{{Length: int32(len(ts)), LowerBound: 1}}, Valid: true}
	}
	at := func(t time.Time) pgtype.Timestamptz { return pgtype.Timestamptz{Time: t, Valid: true} }
	inf := func(m pgtype.InfinityModifier) pgtype.Timestamptz {
		return pgtype.Timestamptz{InfinityModifier: m, Valid: true}
	}
	states := func(b byte) pgtype.Bits { return pgtype.Bits{Bytes: []byte{b}, Len: 8, Valid: true} }
	key := bytes.Repeat([]byte{7}, 32)
	v := NewValidator([]string{"send_receipt", "k"}, 64)
	for _, c := range []struct {
		name string
		row  StagedRow
		want string // the reason code; "" valid
	}{
		{"plain", StagedRow{Kind: "send_receipt", Args: []byte(`{"ride_id": 1}`)}, ""},
		{"every option", StagedRow{Kind: "k", Args: []byte(` {"a":1}`), Queue: str("mail_2-x"), Priority: i32(4), MaxAttempts: i32(32767),
			Tags: tags(str("ride"), str("re-ceipt")), Metadata: []byte(`{"trace":"abc"}`)}, ""},
		{"empty kind", StagedRow{Kind: "", Args: []byte(`{}`)}, ReasonInvalidKind},
		{"128-byte kind", StagedRow{Kind: strings.Repeat("k", 128), Args: []byte(`{}`)}, ReasonInvalidKind},
		{"kind not UTF-8", StagedRow{Kind: "k\xff", Args: []byte(`{}`)}, ReasonInvalidKind},
		{"kind not allowed", StagedRow{Kind: "other", Args: []byte(`{}`)}, ReasonUnknownKind},
		{"args too large", StagedRow{Kind: "k", Args: []byte(`{"x":"` + strings.Repeat("x", 60) + `"}`)}, ReasonArgsTooLarge},
		{"args an array", StagedRow{Kind: "k", Args: []byte(`[1, 2]`)}, ReasonInvalidArgs},
		{"args empty", StagedRow{Kind: "k", Args: nil}, ReasonInvalidArgs},
		{"queue with a space", StagedRow{Kind: "k", Args: []byte(`{}`), Queue: str("Bad Queue!")}, ReasonInvalidQueue},
		{"queue empty", StagedRow{Kind: "k", Args: []byte(`{}`), Queue: str("")}, ReasonInvalidQueue},
		{"queue too long", StagedRow{Kind: "k", Args: []byte(`{}`), Queue: str(strings.Repeat("q", 65))}, ReasonInvalidQueue},
		{"priority 0", StagedRow{Kind: "k", Args: []byte(`{}`), Priority: i32(0)}, ReasonInvalidPrio},
		{"priority 5", StagedRow{Kind: "k", Args: []byte(`{}`), Priority: i32(5)}, ReasonInvalidPrio},
		{"max attempts 0", StagedRow{Kind: "k", Args: []byte(`{}`), MaxAttempts: i32(0)}, ReasonInvalidMaxAtt},
		{"tag with a space", StagedRow{Kind: "k", Args: []byte(`{}`), Tags: tags(str("no spaces allowed"))}, ReasonInvalidTags},
		{"tag too short", StagedRow{Kind: "k", Args: []byte(`{}`), Tags: tags(str("ab"))}, ReasonInvalidTags},
		{"tag NULL", StagedRow{Kind: "k", Args: []byte(`{}`), Tags: tags(str("ride"), nil)}, ReasonInvalidTags},
		{"metadata not an object", StagedRow{Kind: "k", Args: []byte(`{}`), Metadata: []byte(`[1]`)}, ReasonInvalidMeta},
		{"metadata null", StagedRow{Kind: "k", Args: []byte(`{}`), Metadata: []byte(`null`)}, ReasonInvalidMeta},
		{"tags of two dimensions", StagedRow{Kind: "k", Args: []byte(`{}`), Tags: pgtype.Array[*string]{
			Elements: []*string{str("abc"), str("def")}, Dims: []pgtype.ArrayDimension{{Length: 1, LowerBound: 1}, {Length: 2, LowerBound: 1}}, Valid: true}}, ReasonInvalidTags},
		{"scheduled infinity", StagedRow{Kind: "k", Args: []byte(`{}`), ScheduledAt: inf(pgtype.Infinity)}, ReasonInvalidSchedule},
		{"scheduled -infinity", StagedRow{Kind: "k", Args: []byte(`{}`), ScheduledAt: inf(pgtype.NegativeInfinity)}, ReasonInvalidSchedule},
		{"scheduled year 10000", StagedRow{Kind: "k", Args: []byte(`{}`), ScheduledAt: at(TimeMax)}, ReasonInvalidSchedule},
		{"scheduled before year 1", StagedRow{Kind: "k", Args: []byte(`{}`), ScheduledAt: at(TimeMin.Add(-time.Microsecond))}, ReasonInvalidSchedule},
		{"scheduled year 1", StagedRow{Kind: "k", Args: []byte(`{}`), ScheduledAt: at(TimeMin)}, ""},
		{"scheduled year 9999", StagedRow{Kind: "k", Args: []byte(`{}`), ScheduledAt: at(TimeMax.Add(-time.Microsecond))}, ""},
		{"created infinity", StagedRow{Kind: "k", Args: []byte(`{}`), CreatedAt: inf(pgtype.Infinity)}, ReasonInvalidCreated},
		{"unique", StagedRow{Kind: "k", Args: []byte(`{}`), UniqueKey: key, UniqueStates: states(0b11110101)}, ""},
		{"unique key without states", StagedRow{Kind: "k", Args: []byte(`{}`), UniqueKey: key}, ReasonInvalidUnique},
		{"unique states without key", StagedRow{Kind: "k", Args: []byte(`{}`), UniqueStates: states(0b11110101)}, ReasonInvalidUnique},
		{"unique key not a SHA-256", StagedRow{Kind: "k", Args: []byte(`{}`), UniqueKey: key[:31], UniqueStates: states(0b11110101)}, ReasonInvalidUnique},
		{"unique states without running", StagedRow{Kind: "k", Args: []byte(`{}`), UniqueKey: key, UniqueStates: states(0b10110101)}, ReasonInvalidUnique},
	} {
		got := ""
		if bad := v.Check(&c.row); bad != nil {
			got = bad.Code
			if bad.Detail == "" {
				t.Errorf("%s: %s without a detail", c.name, got)
			}
		}
		if got != c.want {
			t.Errorf("%s: reason %q, want %q", c.name, got, c.want)
		}
	}
	// Without an allow-list every kind is accepted.
	anyKind := NewValidator(nil, 64)
	if bad := anyKind.Check(&StagedRow{Kind: "anything", Args: []byte(`{}`)}); bad != nil {
		t.Errorf("no allow-list: %v", bad)
	}
}

// MetadataFor merges idemd_staged_id and idemd_staged_at into the staged
// metadata and keeps every other value exactly as staged: integers above
// 2^53 (a snowflake id, a 64-bit trace id) are not rounded through
// float64, nested ones neither.
func TestMetadataForKeepsNumbersExactly(t *testing.T) {
	at := time.Date(2026, 12, 3, 14, 0, 0, 123456000, time.UTC)
	r := &StagedRow{ID: 42, CreatedAt: pgtype.Timestamptz{Time: at, Valid: true}, Metadata: []byte(`{"big": 9007199254740993, "min": -9223372036854775808,
 "nested": {"id": 12345678901234567891, "list": [18446744073709551615, 0.1]}, "float": 1.5e300, "s": "x<y", "idemd_staged_id": 7}`)}
	md, err := MetadataFor(r)
	if err != nil {
		t.Fatal(err)
	}
	d := json.NewDecoder(bytes.NewReader(md))
	d.UseNumber()
	var got map[string]any
	if err := d.Decode(&got); err != nil {
		t.Fatalf("%s: %v", md, err)
	}
	nested, _ := got["nested"].(map[string]any)
	list, _ := nested["list"].([]any)
	for name, c := range map[string]struct{ got, want any }{
		"big":             {got["big"], json.Number("9007199254740993")},
		"min":             {got["min"], json.Number("-9223372036854775808")},
		"nested.id":       {nested["id"], json.Number("12345678901234567891")},
		"nested.list[0]":  {list[0], json.Number("18446744073709551615")},
		"nested.list[1]":  {list[1], json.Number("0.1")},
		"float":           {got["float"], json.Number("1.5e300")},
		"s":               {got["s"], "x<y"},
		"idemd_staged_id": {got["idemd_staged_id"], json.Number("42")},
		"idemd_staged_at": {got["idemd_staged_at"], "2026-12-03T14:00:00.123456Z"},
	} {
		if c.got != c.want {
			t.Errorf("%s: %v (%T), want %v\nmetadata %s", name, c.got, c.got, c.want, md)
		}
	}
	if len(got) != 7 {
		t.Errorf("keys %v", got)
	}
	// Without staged metadata: just the two keys.
	md, err = MetadataFor(&StagedRow{ID: 9223372036854775807, CreatedAt: pgtype.Timestamptz{Time: at, Valid: true}})
	if err != nil || string(md) != `{"idemd_staged_id":9223372036854775807,"idemd_staged_at":"2026-12-03T14:00:00.123456Z"}` {
		t.Errorf("no staged metadata: %s, %v", md, err)
	}
}

// DeadLetterReasons must name every Reason* constant: one left out would be
// born at 1 on its first row and never alert.
func TestDeadLetterReasonsListsEveryConstant(t *testing.T) {
	consts := reasonConstants(t, "validate.go")
	if len(consts) == 0 {
		t.Fatal("validate.go declares no Reason* constants")
	}
	for name, v := range consts {
		if !slices.Contains(DeadLetterReasons, v) {
			t.Errorf("%s = %q is missing from DeadLetterReasons", name, v)
		}
	}
	if len(DeadLetterReasons) != len(consts) {
		t.Errorf("DeadLetterReasons has %d entries, validate.go %d Reason* constants", len(DeadLetterReasons), len(consts))
	}
}

// reasonConstants returns the string constants named Reason* in file.
func reasonConstants(t *testing.T, file string) map[string]string {
	t.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), file, nil, 0)
	if err != nil {
		t.Fatalf("parse %s: %v", file, err)
	}
	out := map[string]string{}
	for _, d := range f.Decls {
		g, ok := d.(*ast.GenDecl)
		if !ok || g.Tok != token.CONST {
			continue
		}
		for _, s := range g.Specs {
			vs := s.(*ast.ValueSpec)
			for i, n := range vs.Names {
				if !strings.HasPrefix(n.Name, "Reason") || i >= len(vs.Values) {
					continue
				}
				lit, ok := vs.Values[i].(*ast.BasicLit)
				if !ok || lit.Kind != token.STRING {
					t.Fatalf("%s: %s is not a string literal", file, n.Name)
				}
				out[n.Name] = constant.StringVal(constant.MakeFromLiteral(lit.Value, lit.Kind, 0))
			}
		}
	}
	return out
}
