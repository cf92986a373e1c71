package config

import (
	"io"
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
