package enqueuer

import (
	"strings"
	"testing"
)

// The staged-row rules, without a database: each row is judged by what it
// holds alone (validate.go mirrors River's checks so a bad row never fails
// its neighbours' COPY).
func TestValidatorCheck(t *testing.T) {
	str := func(s string) *string { return &s }
	i32 := func(v int32) *int32 { return &v }
	v := newValidator([]string{"send_receipt", "k"}, 64)
	for _, c := range []struct {
		name string
		row  stagedRow
		want string // the reason code; "" valid
	}{
		{"plain", stagedRow{Kind: "send_receipt", Args: []byte(`{"ride_id": 1}`)}, ""},
		{"every option", stagedRow{Kind: "k", Args: []byte(` {"a":1}`), Queue: str("mail_2-x"), Priority: i32(4), MaxAttempts: i32(32767),
			Tags: []string{"ride", "re-ceipt"}, Metadata: []byte(`{"trace":"abc"}`)}, ""},
		{"empty kind", stagedRow{Kind: "", Args: []byte(`{}`)}, ReasonInvalidKind},
		{"128-byte kind", stagedRow{Kind: strings.Repeat("k", 128), Args: []byte(`{}`)}, ReasonInvalidKind},
		{"kind not UTF-8", stagedRow{Kind: "k\xff", Args: []byte(`{}`)}, ReasonInvalidKind},
		{"kind not allowed", stagedRow{Kind: "other", Args: []byte(`{}`)}, ReasonUnknownKind},
		{"args too large", stagedRow{Kind: "k", Args: []byte(`{"x":"` + strings.Repeat("x", 60) + `"}`)}, ReasonArgsTooLarge},
		{"args an array", stagedRow{Kind: "k", Args: []byte(`[1, 2]`)}, ReasonInvalidArgs},
		{"args empty", stagedRow{Kind: "k", Args: nil}, ReasonInvalidArgs},
		{"queue with a space", stagedRow{Kind: "k", Args: []byte(`{}`), Queue: str("Bad Queue!")}, ReasonInvalidQueue},
		{"queue empty", stagedRow{Kind: "k", Args: []byte(`{}`), Queue: str("")}, ReasonInvalidQueue},
		{"queue too long", stagedRow{Kind: "k", Args: []byte(`{}`), Queue: str(strings.Repeat("q", 65))}, ReasonInvalidQueue},
		{"priority 0", stagedRow{Kind: "k", Args: []byte(`{}`), Priority: i32(0)}, ReasonInvalidPrio},
		{"priority 5", stagedRow{Kind: "k", Args: []byte(`{}`), Priority: i32(5)}, ReasonInvalidPrio},
		{"max attempts 0", stagedRow{Kind: "k", Args: []byte(`{}`), MaxAttempts: i32(0)}, ReasonInvalidMaxAtt},
		{"tag with a space", stagedRow{Kind: "k", Args: []byte(`{}`), Tags: []string{"no spaces allowed"}}, ReasonInvalidTags},
		{"tag too short", stagedRow{Kind: "k", Args: []byte(`{}`), Tags: []string{"ab"}}, ReasonInvalidTags},
		{"metadata not an object", stagedRow{Kind: "k", Args: []byte(`{}`), Metadata: []byte(`[1]`)}, ReasonInvalidMeta},
		{"metadata null", stagedRow{Kind: "k", Args: []byte(`{}`), Metadata: []byte(`null`)}, ReasonInvalidMeta},
	} {
		got := ""
		if bad := v.check(&c.row); bad != nil {
			got = bad.code
			if bad.detail == "" {
				t.Errorf("%s: %s without a detail", c.name, got)
			}
		}
		if got != c.want {
			t.Errorf("%s: reason %q, want %q", c.name, got, c.want)
		}
	}
	// Without an allow-list every kind is accepted.
	anyKind := newValidator(nil, 64)
	if bad := anyKind.check(&stagedRow{Kind: "anything", Args: []byte(`{}`)}); bad != nil {
		t.Errorf("no allow-list: %v", bad)
	}
}
