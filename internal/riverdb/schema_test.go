package riverdb

import (
	"strings"
	"testing"
)

// The gate's decision, without a database.
func TestJudgeRiverSchema(t *testing.T) {
	good := func() []Column {
		var cs []Column
		for _, name := range sortedKeys(Writes) {
			cs = append(cs, Column{Name: name, Type: Writes[name], NotNull: name != "unique_key" && name != "unique_states"})
		}
		return append(cs, Column{Name: "id", Type: "bigint", NotNull: true, HasDefault: true},
			Column{Name: "errors", Type: "jsonb[]"})
	}
	known := []int{7, 8}
	for _, c := range []struct {
		name string
		s    Schema
		want string // "" ok, else a word of the reason
	}{
		{"current", Schema{Found: true, HasLine: true, Version: 8, Columns: good()}, ""},
		{"previous", Schema{Found: true, HasLine: true, Version: 7, Columns: good()}, ""},
		{"newer", Schema{Found: true, HasLine: true, Version: 9, Columns: good()}, "newer"},
		{"older", Schema{Found: true, HasLine: true, Version: 6, Columns: good()}, "older"},
		{"before river_migration.line", Schema{Found: true, Columns: good()}, "older"},
		{"not migrated", Schema{}, "idemctl migrate"},
		{"another schema", Schema{Schemas: []string{"jobs"}}, "search_path = jobs"},
		{"a NOT NULL column added", Schema{Found: true, HasLine: true, Version: 8,
			Columns: append(good(), Column{Name: "tenant", Type: "integer", NotNull: true})}, "tenant is NOT NULL"},
		{"a nullable column added", Schema{Found: true, HasLine: true, Version: 8,
			Columns: append(good(), Column{Name: "tenant", Type: "integer"})}, ""},
		{"a NOT NULL column with a default added", Schema{Found: true, HasLine: true, Version: 8,
			Columns: append(good(), Column{Name: "tenant", Type: "integer", NotNull: true, HasDefault: true})}, ""},
		{"a column missing", Schema{Found: true, HasLine: true, Version: 8, Columns: good()[1:]}, "args is missing"},
		{"a column retyped", Schema{Found: true, HasLine: true, Version: 8,
			Columns: append(good()[1:], Column{Name: "args", Type: "json", NotNull: true})}, "args is json"},
	} {
		ok, why := Judge(c.s, known)
		switch {
		case c.want == "" && !ok:
			t.Errorf("%s: refused: %s", c.name, why)
		case c.want != "" && ok:
			t.Errorf("%s: accepted, want refused (%s)", c.name, c.want)
		case c.want != "" && !strings.Contains(why, c.want):
			t.Errorf("%s: reason %q does not say %q", c.name, why, c.want)
		}
	}
}
