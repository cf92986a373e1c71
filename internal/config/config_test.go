package config

import (
	"errors"
	"io"
	"strings"
	"testing"
	"time"
)

type cli struct {
	Common `embed:""`
	Every  time.Duration `name:"every" default:"1s"`
	Size   int           `name:"size" default:"10"`
}

func (c *cli) Check() []string {
	p := c.Common.Check()
	if c.Size < 1 {
		p = append(p, "--size must be positive")
	}
	return p
}

func TestParseReportsEveryProblem(t *testing.T) {
	t.Setenv("DATABASE_URL", "")
	t.Setenv("IDEMD_SIZE", "0")
	_, err := Parse("x", "", &cli{}, []string{"--every=soon", "--http-addr=nope"}, io.Discard)
	var cerr *Error
	if !errors.As(err, &cerr) {
		t.Fatalf("got %v", err)
	}
	joined := strings.Join(cerr.Problems, "\n")
	for _, want := range []string{"--every", "--database-url (or DATABASE_URL) is required", "--http-addr", "--size must be positive"} {
		if !strings.Contains(joined, want) {
			t.Errorf("missing %q in:\n%s", want, joined)
		}
	}
}

func TestParseEnvAndHelp(t *testing.T) {
	t.Setenv("DATABASE_URL", "postgres://u@h/d")
	t.Setenv("IDEMD_EVERY", "3s")
	c := &cli{}
	if _, err := Parse("x", "", c, nil, io.Discard); err != nil {
		t.Fatal(err)
	}
	if c.DatabaseURL != "postgres://u@h/d" || c.Every != 3*time.Second || c.Size != 10 {
		t.Fatalf("parsed %+v", c)
	}
	var out strings.Builder
	if _, err := Parse("x", "", &cli{}, []string{"--help"}, &out); !errors.Is(err, ErrHelp) {
		t.Fatalf("help: %v", err)
	}
	if !strings.Contains(out.String(), "IDEMD_EVERY") || !strings.Contains(out.String(), "DATABASE_URL") {
		t.Fatalf("help lacks env names:\n%s", out.String())
	}
}
