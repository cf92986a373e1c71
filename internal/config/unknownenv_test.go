package config

import (
	"slices"
	"testing"
)

// TestUnknownEnv: a mistyped IDEMD_ variable is named with the known one
// nearest to it, a known one (of any subcommand) and a variable without
// the prefix are not, and a correct environment gives nothing.
func TestUnknownEnv(t *testing.T) {
	type sub struct {
		LockWait int `name:"lock-wait" default:"1"`
	}
	type tool struct {
		cli
		Migrate sub `cmd:""`
		Status  struct {
			Output string `name:"output" default:"text"`
		} `cmd:""`
	}
	app, err := Model("x", &tool{})
	if err != nil {
		t.Fatal(err)
	}
	known := KnownEnv(app)
	for _, want := range []string{"DATABASE_URL", "IDEMD_SIZE", "IDEMD_LOCK_WAIT", "IDEMD_OUTPUT", "IDEMD_LOG_FORMAT"} {
		if !slices.Contains(known, want) {
			t.Errorf("KnownEnv lacks %s: %v", want, known)
		}
	}
	if got := UnknownEnv(known, []string{"IDEMD_SIZE=3", "IDEMD_LOCK_WAIT=1", "DATABASE_URL=x", "HOME=/root", "PATH=/bin"}); len(got) != 0 {
		t.Errorf("a correct environment: %v, want no warning", got)
	}
	got := UnknownEnv(known, []string{"IDEMD_SIZE=3", "IDEMD_SIZEE=5", "HOME=/root", "IDEMD_LOCK_WAITT=2s", "IDEMD_DATABASE_URL=postgres://"})
	want := []UnknownVar{{"IDEMD_SIZEE", "IDEMD_SIZE"}, {"IDEMD_LOCK_WAITT", "IDEMD_LOCK_WAIT"}, {"IDEMD_DATABASE_URL", "DATABASE_URL"}}
	if !slices.Equal(got, want) {
		t.Errorf("UnknownEnv = %v, want %v", got, want)
	}
}

func TestEditDistance(t *testing.T) {
	for _, tc := range []struct {
		a, b string
		want int
	}{
		{"", "", 0}, {"abc", "", 3}, {"", "ab", 2}, {"kitten", "sitting", 3},
		{"IDEMD_RATEE", "IDEMD_RATE", 1}, {"IDEMD_RAET", "IDEMD_RATE", 2}, {"flaw", "lawn", 2},
	} {
		if got := editDistance(tc.a, tc.b); got != tc.want {
			t.Errorf("editDistance(%q, %q) = %d, want %d", tc.a, tc.b, got, tc.want)
		}
	}
}
