// Package opshttp serves the operational endpoints every long-running daemon
// exposes: /healthz (process alive, never touches the database), /readyz
// (database reachable, schema migrated and the last pass recent) and /metrics (Prometheus).
package opshttp

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Readiness tracks whether the daemon is doing its work.
type Readiness struct {
	// Ping checks the database; it is given a short timeout.
	Ping func(ctx context.Context) error
	// Schema checks that the database has the migrations the binary
	// expects; its error says which are missing. Optional.
	Schema func(ctx context.Context) error
	// Note, when it returns something, is said under /readyz's "ok": a
	// condition that does not stop the daemon but an operator should see
	// (a database schema newer than the binary). Optional.
	Note func() string
	// Blocked, when it returns an error, says the service cannot do its
	// work at all, whatever its passes do (the enqueuer on a River schema
	// it does not write). Optional; set before the daemon serves.
	Blocked func() error
	// Database, when it returns an error, is the database call that ran
	// out of its bound (a *dbcall.TimeoutError, naming the operation) and
	// has not been followed by one that answered. Optional.
	Database func() error
	// CallTimeout bounds Ping and Schema; zero is ProbeTimeout.
	CallTimeout time.Duration
	lastPass    atomic.Int64 // unix nanos
	started     atomic.Int64
	maxPassAge  atomic.Int64 // a time.Duration; SetMaxPassAge
}

// ProbeTimeout is the longest /readyz waits for the database: under the
// probe's own timeout (3 s in deploy/base), so a database that does not
// answer fails the probe with a reason rather than by the kubelet's
// timeout.
const ProbeTimeout = 2 * time.Second

// SetMaxPassAge sets how old the last successful pass may be before
// /readyz fails (zero, the default, disables the check). A service sets it
// when it starts, while /readyz may already be answering.
func (r *Readiness) SetMaxPassAge(d time.Duration) { r.maxPassAge.Store(int64(d)) }

// MaxPassAge is the limit SetMaxPassAge set.
func (r *Readiness) MaxPassAge() time.Duration { return time.Duration(r.maxPassAge.Load()) }

// MarkPass records a successful pass (a drained batch, a sweep, a run).
func (r *Readiness) MarkPass(t time.Time) { r.lastPass.Store(t.UnixNano()) }

// Check returns nil when ready, or why not.
func (r *Readiness) Check(ctx context.Context, now time.Time) error {
	// First: it names the operation the service is stuck on, where a
	// ping says only that the database is unreachable.
	if r.Database != nil {
		if err := r.Database(); err != nil {
			return err
		}
	}
	timeout := r.CallTimeout
	if timeout <= 0 {
		timeout = ProbeTimeout
	}
	if r.Ping != nil {
		pctx, cancel := context.WithTimeout(ctx, timeout)
		defer cancel()
		if err := r.Ping(pctx); err != nil {
			return fmt.Errorf("database unreachable: %w", err)
		}
	}
	if r.Schema != nil {
		sctx, cancel := context.WithTimeout(ctx, timeout)
		defer cancel()
		if err := r.Schema(sctx); err != nil {
			return err
		}
	}
	if r.Blocked != nil {
		if err := r.Blocked(); err != nil {
			return err
		}
	}
	if maxAge := r.MaxPassAge(); maxAge > 0 {
		last := r.lastPass.Load()
		if last == 0 {
			// Grace for a fresh process that has not finished its first pass.
			if s := r.started.Load(); s != 0 && now.Sub(time.Unix(0, s)) > maxAge {
				return errors.New("no successful pass since start")
			}
			if r.started.Load() == 0 {
				return errors.New("not started")
			}
			return nil
		}
		if age := now.Sub(time.Unix(0, last)); age > maxAge {
			return fmt.Errorf("last successful pass %s ago (limit %s)", age.Round(time.Millisecond), maxAge)
		}
	}
	return nil
}

// MarkStarted starts the first-pass grace period.
func (r *Readiness) MarkStarted(t time.Time) { r.started.Store(t.UnixNano()) }

// Handler returns the mux with the three endpoints.
func Handler(reg *prometheus.Registry, ready *Readiness) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		if err := ready.Check(r.Context(), time.Now()); err != nil {
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = fmt.Fprintf(w, "not ready: %v\n", err)
			return
		}
		_, _ = w.Write([]byte("ok\n"))
		if ready.Note != nil {
			if note := ready.Note(); note != "" {
				_, _ = fmt.Fprintf(w, "note: %s\n", note)
			}
		}
	})
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	return mux
}

// Server is a started ops HTTP server.
type Server struct {
	srv  *http.Server
	done chan error
	Addr string // the bound address (useful with ":0")
}

// Start listens on addr and serves in the background.
func Start(addr string, h http.Handler) (*Server, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("opshttp: listen %s: %w", addr, err)
	}
	s := &Server{
		srv:  &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second},
		done: make(chan error, 1),
		Addr: ln.Addr().String(),
	}
	go func() { s.done <- s.srv.Serve(ln) }()
	return s, nil
}

// Stop shuts the server down gracefully within ctx.
func (s *Server) Stop(ctx context.Context) error {
	err := s.srv.Shutdown(ctx)
	if serveErr := <-s.done; serveErr != nil && !errors.Is(serveErr, http.ErrServerClosed) {
		return fmt.Errorf("opshttp: serve: %w", serveErr)
	}
	if err != nil {
		return fmt.Errorf("opshttp: shutdown: %w", err)
	}
	return nil
}
