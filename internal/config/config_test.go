package config

import (
	"errors"
	"fmt"
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

// flagsCLI has the value types Parse decodes and Check rules on each, as
// the commands' Checks have.
type flagsCLI struct {
	Common    `embed:""`
	BatchSize int           `name:"batch-size" default:"100"`
	Retention time.Duration `name:"retention" default:"72h"`
	Rate      float64       `name:"rate" default:"20"`
	Pause     time.Duration `name:"pause" default:"10ms"`
	MaxKeys   int64         `name:"max-keys" default:"0"`
}

func (c *flagsCLI) Check() []string {
	p := c.Common.Check()
	if c.BatchSize < 1 {
		p = append(p, fmt.Sprintf("--batch-size must be between 1 and 1000, got %d", c.BatchSize))
	}
	if c.Retention < time.Hour {
		p = append(p, fmt.Sprintf("--retention %s is below the minimum 1h", c.Retention))
	}
	if c.Rate < 0 {
		p = append(p, "--rate must not be negative")
	}
	if c.Pause < 0 {
		p = append(p, "--pause must not be negative")
	}
	if c.MaxKeys < 0 {
		p = append(p, "--max-keys must not be negative (0 means no cap)")
	}
	return p
}

// parseProblems parses args into a fresh flagsCLI with a database URL set
// and returns the problems (nil when the parse succeeded).
func parseProblems(t *testing.T, args ...string) (*flagsCLI, []string) {
	t.Helper()
	t.Setenv("DATABASE_URL", "postgres://u@h/d")
	c := &flagsCLI{}
	_, err := Parse("x", "", c, args, io.Discard)
	if err == nil {
		return c, nil
	}
	var cerr *Error
	if !errors.As(err, &cerr) {
		t.Fatalf("%v: not a *config.Error: %v", args, err)
	}
	return c, cerr.Problems
}

// A value that does not decode is one problem, not also the Check rule it
// would then fail as a zero value.
func TestParseOneProblemPerBadValue(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--batch-size=abc"}, `--batch-size: "abc" is not a whole number`},
		{[]string{"--batch-size", "abc"}, `--batch-size: "abc" is not a whole number`},
		{[]string{"--retention", "1y"}, `--retention: "1y" is not a duration`},
		{[]string{"--rate=fast"}, `--rate: "fast" is not a number`},
		{[]string{"--max-keys=99999999999999999999"}, `--max-keys: "99999999999999999999" is out of range`},
	} {
		_, problems := parseProblems(t, tc.args...)
		if len(problems) != 1 || !strings.HasPrefix(problems[0], tc.want) {
			t.Errorf("%q: problems %q, want exactly one starting %q", tc.args, problems, tc.want)
		}
	}
}

// Every bad value is reported, the enums' too (kong stops at the first),
// and so are the Check problems of the values that did decode.
func TestParseReportsEveryBadValue(t *testing.T) {
	_, problems := parseProblems(t, "--log-level", "loud", "--log-format", "xml", "--batch-size=x", "--pause=-1s", "--http-addr=nope")
	joined := strings.Join(problems, "\n")
	for _, want := range []string{
		`--log-level: "loud" is not one of debug, info, warn, error`,
		`--log-format: "xml" is not one of json, console`,
		`--batch-size: "x" is not a whole number`,
		"--pause must not be negative",
		`--http-addr "nope"`,
	} {
		if !strings.Contains(joined, want) {
			t.Errorf("missing %q in:\n%s", want, joined)
		}
	}
	if len(problems) != 5 {
		t.Errorf("%d problems, want 5:\n%s", len(problems), joined)
	}
}

// A negative number after a flag is its value, in both spellings, for
// numbers and durations alike; Check then judges it.
func TestParseNegativeNumbers(t *testing.T) {
	for _, args := range [][]string{{"--rate", "-1"}, {"--rate=-1"}} {
		c, problems := parseProblems(t, args...)
		if len(problems) != 1 || problems[0] != "--rate must not be negative" || c.Rate != -1 {
			t.Errorf("%q: rate %v, problems %q; want -1 refused by Check alone", args, c.Rate, problems)
		}
	}
	c, problems := parseProblems(t, "--pause", "-1.5s", "--max-keys", "-3", "--batch-size", "7")
	if c.Pause != -1500*time.Millisecond || c.MaxKeys != -3 || c.BatchSize != 7 || len(problems) != 2 {
		t.Errorf("parsed pause %v max-keys %d batch-size %d, problems %q", c.Pause, c.MaxKeys, c.BatchSize, problems)
	}
	// A flag is still not a value: kong's own message says so.
	if _, problems := parseProblems(t, "--rate", "--batch-size=5"); len(problems) != 1 || !strings.Contains(problems[0], "--rate") {
		t.Errorf("--rate --batch-size=5: problems %q", problems)
	}
}

// An environment variable's bad value is reported under its name; the
// command line overrides it.
func TestParseNamesTheEnvironmentVariable(t *testing.T) {
	t.Setenv("IDEMD_BATCH_SIZE", "abc")
	t.Setenv("IDEMD_LOG_LEVEL", "loud")
	_, problems := parseProblems(t)
	joined := strings.Join(problems, "\n")
	for _, want := range []string{
		`IDEMD_BATCH_SIZE (--batch-size): "abc" is not a whole number`,
		`IDEMD_LOG_LEVEL (--log-level): "loud" is not one of`,
	} {
		if !strings.Contains(joined, want) {
			t.Errorf("missing %q in:\n%s", want, joined)
		}
	}
	if len(problems) != 2 {
		t.Errorf("%d problems, want 2:\n%s", len(problems), joined)
	}
	c, problems := parseProblems(t, "--batch-size=5", "--log-level=warn")
	if problems != nil || c.BatchSize != 5 || c.LogLevel != "warn" {
		t.Errorf("flags over bad env: batch-size %d log-level %q, problems %q", c.BatchSize, c.LogLevel, problems)
	}
}

type subCLI struct {
	Database `embed:""`
	Run      struct {
		Every time.Duration `name:"every" default:"1s"`
	} `cmd:""`
	Status struct {
		Window time.Duration `name:"window" default:"1h"`
	} `cmd:""`
}

// An environment variable of another subcommand's flag is not this one's
// problem.
func TestParseIgnoresOtherSubcommandsEnv(t *testing.T) {
	t.Setenv("DATABASE_URL", "postgres://u@h/d")
	t.Setenv("IDEMD_WINDOW", "soon")
	if _, err := Parse("x", "", &subCLI{}, []string{"run"}, io.Discard); err != nil {
		t.Errorf("run: %v", err)
	}
	_, err := Parse("x", "", &subCLI{}, []string{"status"}, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "IDEMD_WINDOW (--window)") {
		t.Errorf("status: %v, want IDEMD_WINDOW named", err)
	}
}

type validatingCLI struct {
	Database `embed:""`
	Status   validatingCmd `cmd:""`
}

type validatingCmd struct {
	Retention time.Duration `name:"retention" default:"72h"`
}

func (c *validatingCmd) Validate() error {
	if c.Retention <= 0 {
		return errors.New("--retention must be positive")
	}
	return nil
}

// A subcommand's Validate (kong runs it) is held to the same rule as Check:
// no second problem for a flag that did not decode.
func TestParseValidateSkipsUndecodedFlags(t *testing.T) {
	t.Setenv("DATABASE_URL", "postgres://u@h/d")
	_, err := Parse("x", "", &validatingCLI{}, []string{"status", "--retention=abc"}, io.Discard)
	var cerr *Error
	if !errors.As(err, &cerr) || len(cerr.Problems) != 1 || !strings.Contains(cerr.Problems[0], `"abc" is not a duration`) {
		t.Errorf("got %v, want the one decode problem", err)
	}
	_, err = Parse("x", "", &validatingCLI{}, []string{"status", "--retention=-1h"}, io.Discard)
	if !errors.As(err, &cerr) || len(cerr.Problems) != 1 || !strings.Contains(cerr.Problems[0], "--retention must be positive") {
		t.Errorf("got %v, want Validate's problem", err)
	}
}

func TestProblems(t *testing.T) {
	if err := Problems(nil); err != nil {
		t.Fatalf("no problems: %v", err)
	}
	var cerr *Error
	if err := Problems([]string{"--a", "--b"}); !errors.As(err, &cerr) || len(cerr.Problems) != 2 {
		t.Fatalf("two problems: %v", err)
	}
}
