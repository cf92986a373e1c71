package daemon

import (
	"context"
	"io"
	"testing"

	"github.com/idemd/idemd/internal/config"
)

type onceCmd struct {
	config.Common `embed:""`
	Once          bool `name:"once"`
	DryRun        bool `name:"dry-run"`
}

func (c *onceCmd) CommonConfig() *config.Common    { return &c.Common }
func (c *onceCmd) Run(context.Context, *Env) error { return nil }
func (c *onceCmd) LongRunning() bool               { return !c.Once && !c.DryRun }

type scheduledCmd struct {
	config.Common `embed:""`
	Schedule      string `name:"schedule"`
}

func (c *scheduledCmd) CommonConfig() *config.Common    { return &c.Common }
func (c *scheduledCmd) Run(context.Context, *Env) error { return nil }
func (c *scheduledCmd) LongRunning() bool               { return c.Schedule != "" }

// The ops server's address: --http-addr (default :9090) for a long-running
// run, and for a one-shot run only an address given explicitly.
func TestOpsAddr(t *testing.T) {
	t.Setenv("DATABASE_URL", "postgres://u@h/d")
	for _, tc := range []struct {
		name string
		cmd  Command
		args []string
		env  string // IDEMD_HTTP_ADDR, when set
		want string
	}{
		{"daemon", &onceCmd{}, nil, "", ":9090"},
		{"daemon --http-addr", &onceCmd{}, []string{"--http-addr", "127.0.0.1:1"}, "", "127.0.0.1:1"},
		{"--once", &onceCmd{}, []string{"--once"}, "", ""},
		{"--dry-run", &onceCmd{}, []string{"--dry-run"}, "", ""},
		{"--once --http-addr", &onceCmd{}, []string{"--once", "--http-addr=127.0.0.1:1"}, "", "127.0.0.1:1"},
		{"--once --http-addr=:9090", &onceCmd{}, []string{"--once", "--http-addr=:9090"}, "", ":9090"},
		{"--once IDEMD_HTTP_ADDR", &onceCmd{}, []string{"--once"}, "127.0.0.1:2", "127.0.0.1:2"},
		{"no --schedule", &scheduledCmd{}, nil, "", ""},
		{"--schedule", &scheduledCmd{}, []string{"--schedule", "@hourly"}, "", ":9090"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.env != "" {
				t.Setenv("IDEMD_HTTP_ADDR", tc.env)
			}
			kctx, err := config.Parse("x", "", tc.cmd, tc.args, io.Discard)
			if err != nil {
				t.Fatal(err)
			}
			if got := opsAddr(tc.cmd, kctx, tc.cmd.CommonConfig().HTTPAddr); got != tc.want {
				t.Errorf("ops address %q, want %q", got, tc.want)
			}
		})
	}
}
