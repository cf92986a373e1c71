package ctl

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/idemd/idemd/internal/console"
	"github.com/idemd/idemd/internal/logging"
	"github.com/idemd/idemd/internal/reaper"
)

// ConsoleCmd serves the web console until SIGTERM.
type ConsoleCmd struct {
	Listen         string `name:"listen" default:"127.0.0.1:8080" help:"Address to serve the console on. Anything but loopback requires --operator-header (an authenticating proxy in front)."`
	Operator       string `name:"operator" env:"IDEMD_OPERATOR" help:"The one identity every action from this console is recorded under (a console on loopback for one person). Excludes --operator-header."`
	OperatorHeader string `name:"operator-header" help:"Request header carrying the user an authenticating proxy signed in (oauth2-proxy: X-Forwarded-Email or X-Forwarded-User); requests without it are refused. Only safe when nothing but the proxy reaches the console."`
	ReadOnly       bool   `name:"read-only" help:"Refuse every action; pages only."`
	River          bool   `name:"river" default:"true" negatable:"" help:"Serve River's own UI (riverui) under /river/."`
	RiverActions   bool   `name:"river-actions" help:"Let riverui's own job actions (cancel, retry, delete) through for a request with an operator identity. They are logged, not recorded in idemd_operator_actions."`
	// The status page's rules when no reaper run recorded the retention and
	// lock window it runs with: the reaper's own flags, as for idemctl
	// status.
	reaper.Eligibility `embed:""`
	GiveUpAfter        time.Duration `name:"give-up-after" default:"${give_up_after}" help:"The completer's --give-up-after: keys older than this are not retried."`
	ShutdownTimeout    time.Duration `name:"shutdown-timeout" default:"10s" help:"On SIGTERM, how long requests in flight may take to finish."`
}

// Validate reports every problem with the console's flags (exit 2).
func (c *ConsoleCmd) Validate() error {
	var p []string
	host, _, err := net.SplitHostPort(c.Listen)
	if err != nil {
		p = append(p, fmt.Sprintf("--listen %q: %v", c.Listen, err))
	} else if !loopback(host) && c.OperatorHeader == "" {
		p = append(p, fmt.Sprintf("--listen %q is not a loopback address: serve the console behind an authenticating proxy and give --operator-header, or listen on 127.0.0.1 and use port-forwarding", c.Listen))
	}
	if c.Operator != "" && c.OperatorHeader != "" {
		p = append(p, "--operator and --operator-header exclude each other: with a proxy, the proxy says who acts")
	}
	p = append(p, c.Eligibility.Check()...)
	if c.GiveUpAfter <= 0 {
		p = append(p, "--give-up-after must be positive")
	}
	if c.ShutdownTimeout <= 0 {
		p = append(p, "--shutdown-timeout must be positive")
	}
	return problems(p)
}

func loopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// Run serves until ctx ends (SIGTERM, SIGINT), then shuts the server down
// gracefully: no new connections, requests in flight get --shutdown-timeout.
func (c *ConsoleCmd) Run(ctx context.Context, g *Globals) error {
	handler, err := c.handler(ctx, g)
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", c.Listen)
	if err != nil {
		return fmt.Errorf("console: %w", err)
	}
	srv := &http.Server{Handler: handler, ReadHeaderTimeout: 10 * time.Second}
	g.Logger.Info("console serving", zap.String("addr", ln.Addr().String()), zap.Bool("read_only", c.ReadOnly),
		zap.String("operator", c.Operator), zap.String("operator_header", c.OperatorHeader))
	fmt.Fprintf(g.Stdout, "console: serving on http://%s/\n", ln.Addr())
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	select {
	case err := <-served:
		return fmt.Errorf("console: %w", err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.ShutdownTimeout)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		return fmt.Errorf("console: shutdown: %w", err)
	}
	<-served
	g.Logger.Info("console stopped")
	return nil
}

// handler builds the console; riverui's background services stop with ctx.
func (c *ConsoleCmd) handler(ctx context.Context, g *Globals) (http.Handler, error) {
	cfg := console.Config{
		Pool: g.Pool, Eligibility: c.Eligibility,
		Operator: strings.TrimSpace(c.Operator), OperatorHeader: c.OperatorHeader, ReadOnly: c.ReadOnly,
		RiverActions: c.RiverActions, GiveUpAfter: c.GiveUpAfter, Logger: g.Logger,
	}
	if c.River {
		river, err := console.NewRiverUI(ctx, g.Pool, logging.Slog(g.Logger))
		if err != nil {
			return nil, err
		}
		cfg.River = river
	}
	h, err := console.New(cfg)
	if err != nil {
		return nil, err
	}
	return boundRequests(h, g.Calls.Timeout()), nil
}

// boundRequests gives each request's context a deadline d away: every
// database call a page makes ends within it, so a database that does not
// answer fails the page instead of holding the operator's browser.
func boundRequests(h http.Handler, d time.Duration) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), d)
		defer cancel()
		h.ServeHTTP(w, r.WithContext(ctx))
	})
}
