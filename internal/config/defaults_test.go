package config

import (
	"io"
	"strings"
	"testing"
	"time"
)

type defaultsSettings struct {
	Size   int           `name:"batch-size" default:"${batch_size}"`
	Pause  time.Duration `name:"batch-pause" default:"${batch_pause}"`
	Kinds  []string      `name:"kinds" sep:"," default:"${kinds}"`
	Rate   float64       `name:"rate" default:"${rate}"`
	Flag   bool          `name:"flag" default:"${flag}"`
	Tagged string        `name:"tagged" default:"${tagged}"`
}

type defaultsCLI struct {
	defaultsSettings `embed:""`
	Other            string `name:"other"`
}

func (defaultsCLI) FlagDefaults() any {
	return defaultsSettings{Size: 5000, Pause: 72 * time.Hour, Kinds: []string{"a", "b"}, Rate: 2.5, Flag: true, Tagged: "x y"}
}

// An empty command line yields exactly the defaults the service wrote, and
// flags still override them.
func TestFlagDefaultsComeFromTheSettings(t *testing.T) {
	var cli defaultsCLI
	if _, err := Parse("t", "", &cli, nil, io.Discard); err != nil {
		t.Fatal(err)
	}
	want := cli.FlagDefaults().(defaultsSettings)
	got := cli.defaultsSettings
	if got.Size != want.Size || got.Pause != want.Pause || len(got.Kinds) != 2 || got.Kinds[1] != "b" ||
		got.Rate != want.Rate || got.Flag != want.Flag || got.Tagged != want.Tagged {
		t.Fatalf("parsed %+v, want %+v", got, want)
	}
	var over defaultsCLI
	if _, err := Parse("t", "", &over, []string{"--batch-size=7", "--batch-pause=1s"}, io.Discard); err != nil {
		t.Fatal(err)
	}
	if over.Size != 7 || over.Pause != time.Second {
		t.Fatalf("flags did not override: %+v", over.defaultsSettings)
	}
}

func TestFormatDuration(t *testing.T) {
	for d, want := range map[time.Duration]string{
		72 * time.Hour: "72h", time.Minute: "1m", 90 * time.Second: "1m30s",
		10 * time.Millisecond: "10ms", time.Hour + time.Second: "1h0m1s", 0: "0s",
	} {
		if got := FormatDuration(d); got != want {
			t.Errorf("FormatDuration(%v) = %q, want %q", d, got, want)
		}
	}
}

// otherSettings are a second package's settings, embedded in a command as
// a named field.
type otherSettings struct {
	Interval time.Duration `name:"other-interval" default:"${other_interval}"`
	Limit    int           `name:"other-limit" default:"${other_limit}"`
}

// prefixedSettings are embedded with a prefix: their flags are
// --pfx-<name>, their variables pfx_<name>.
type prefixedSettings struct {
	Size int `name:"size" default:"${pfx_size}"`
}

type namedEmbedCLI struct {
	defaultsSettings `embed:""`
	Other            otherSettings    `embed:""`
	Prefixed         prefixedSettings `embed:"" prefix:"pfx-"`
}

func (namedEmbedCLI) FlagDefaults() any {
	return struct {
		defaultsSettings `embed:""`
		Other            otherSettings    `embed:""`
		Prefixed         prefixedSettings `embed:"" prefix:"pfx-"`
	}{
		defaultsSettings{Size: 5000, Pause: 72 * time.Hour, Kinds: []string{"a"}, Rate: 2.5, Tagged: "x"},
		otherSettings{Interval: 30 * time.Second, Limit: 9},
		prefixedSettings{Size: 3},
	}
}

// Vars walks named fields tagged embed:"" as kong does, with their
// prefix: each package's defaults reach its flags, and flags override them.
func TestFlagDefaultsOfNamedEmbeds(t *testing.T) {
	vars, err := Vars(namedEmbedCLI{}.FlagDefaults())
	if err != nil {
		t.Fatal(err)
	}
	for k, want := range map[string]string{"batch_size": "5000", "other_interval": "30s", "other_limit": "9", "pfx_size": "3"} {
		if vars[k] != want {
			t.Errorf("vars[%q] = %q, want %q", k, vars[k], want)
		}
	}
	if _, ok := vars["size"]; ok {
		t.Error("a prefixed field's variable is keyed without its prefix")
	}
	// A struct field without embed:"" is not flags.
	if vars, err := Vars(struct{ NotEmbedded otherSettings }{otherSettings{Limit: 1}}); err != nil || len(vars) != 0 {
		t.Errorf("Vars of a struct field without embed:\"\" = %v, %v; want nothing", vars, err)
	}

	var cli namedEmbedCLI
	if _, err := Parse("t", "", &cli, nil, io.Discard); err != nil {
		t.Fatal(err)
	}
	if cli.Size != 5000 || cli.Other.Interval != 30*time.Second || cli.Other.Limit != 9 || cli.Prefixed.Size != 3 {
		t.Fatalf("parsed %+v, want every package's defaults", cli)
	}
	var over namedEmbedCLI
	if _, err := Parse("t", "", &over, []string{"--other-limit=4", "--pfx-size=8"}, io.Discard); err != nil {
		t.Fatal(err)
	}
	if over.Other.Limit != 4 || over.Prefixed.Size != 8 || over.Other.Interval != 30*time.Second {
		t.Fatalf("flags did not override: %+v", over)
	}
	t.Setenv("IDEMD_OTHER_INTERVAL", "1m")
	var env namedEmbedCLI
	if _, err := Parse("t", "", &env, nil, io.Discard); err != nil {
		t.Fatal(err)
	}
	if env.Other.Interval != time.Minute {
		t.Fatalf("IDEMD_OTHER_INTERVAL did not set --other-interval: %+v", env.Other)
	}
}

// Two fields giving one flag's default are refused.
func TestVarsRefusesADuplicate(t *testing.T) {
	_, err := Vars(struct {
		A otherSettings `embed:""`
		B otherSettings `embed:""`
	}{})
	if err == nil || !strings.Contains(err.Error(), "--other-interval") {
		t.Fatalf("Vars of two embeds of the same settings: %v, want an error naming --other-interval", err)
	}
}
