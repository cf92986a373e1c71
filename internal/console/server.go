package console

import (
	"bytes"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"embed"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/zap"

	"github.com/idemd/idemd/internal/operator"
	"github.com/idemd/idemd/internal/reaper"
)

// Config configures the web console.
type Config struct {
	Pool *pgxpool.Pool
	// Eligibility is the reaper's rules the status page counts keys past
	// retention by when no reaper run recorded its own (operator.Status).
	Eligibility reaper.Eligibility
	// Operator is the one identity every action of this process is
	// recorded under (--operator): for a console on loopback, reached
	// through `kubectl port-forward` by one person.
	Operator string
	// OperatorHeader names the request header an authenticating proxy
	// (oauth2-proxy's X-Forwarded-User, X-Forwarded-Email) sets to the
	// signed-in user (--operator-header). Every request must carry it: one
	// without it did not come through the proxy and is refused. Only safe
	// when nothing but the proxy can reach the console (a NetworkPolicy).
	OperatorHeader string
	// ReadOnly refuses every action, whoever asks.
	ReadOnly bool
	// River serves River's own UI under /river/ (riverui); nil: not mounted.
	River http.Handler
	// RiverActions lets riverui's own state-changing API (cancel, retry,
	// delete River jobs) through, for a request with an operator identity.
	// Those are not recorded in idemd_operator_actions, only logged.
	RiverActions bool
	// GiveUpAfter is the completer's --give-up-after (operator.KeyState, operator.RetryKey).
	GiveUpAfter time.Duration
	Logger      *zap.Logger
	// Secret keys the CSRF tokens; nil: a random one per process.
	Secret []byte
}

// Server is the web console's handler.
type Server struct {
	cfg    Config
	log    *zap.Logger
	secret []byte
	pages  map[string]*template.Template
	mux    *http.ServeMux
}

//go:embed templates/*.html static/*
var assets embed.FS

// New builds the console.
func New(cfg Config) (*Server, error) {
	if cfg.Pool == nil {
		return nil, errors.New("console: a pool is required")
	}
	if p := cfg.Eligibility.Check(); len(p) > 0 {
		return nil, fmt.Errorf("console: %s", strings.Join(p, "; "))
	}
	if cfg.Operator != "" && cfg.OperatorHeader != "" {
		return nil, errors.New("console: --operator and --operator-header exclude each other")
	}
	s := &Server{cfg: cfg, log: cfg.Logger, secret: cfg.Secret}
	if s.log == nil {
		s.log = zap.NewNop()
	}
	if s.secret == nil {
		s.secret = make([]byte, 32)
		if _, err := rand.Read(s.secret); err != nil {
			return nil, fmt.Errorf("console: secret: %w", err)
		}
	}
	var err error
	if s.pages, err = parsePages(); err != nil {
		return nil, err
	}
	static, _ := fs.Sub(assets, "static")
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	mux.Handle("GET /static/", http.StripPrefix("/static/", http.FileServerFS(static)))
	mux.HandleFunc("GET /{$}", s.page(s.status))
	mux.HandleFunc("GET /reviews", s.page(s.reviews))
	mux.HandleFunc("POST /reviews/{id}/resolve", s.page(s.action(s.resolve)))
	mux.HandleFunc("GET /keys", s.page(s.keyLookup))
	mux.HandleFunc("GET /keys/{id}", s.page(s.key))
	mux.HandleFunc("POST /keys/{id}/retry", s.page(s.action(s.retry)))
	mux.HandleFunc("GET /dead", s.page(s.deadList))
	mux.HandleFunc("GET /dead/{id}", s.page(s.dead))
	mux.HandleFunc("POST /dead/{id}/requeue", s.page(s.action(s.requeue)))
	if cfg.River != nil {
		mux.Handle("/river/", s.river(cfg.River))
		mux.Handle("GET /river", http.RedirectHandler("/river/", http.StatusFound))
	}
	s.mux = mux
	return s, nil
}

// ServeHTTP serves the console. Every non-safe request from a browser on
// another origin is refused before any handler (net/http's
// CrossOriginProtection: Sec-Fetch-Site, else Origin against Host); the
// console's own forms also carry a token (csrfToken).
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	cop := http.NewCrossOriginProtection()
	cop.SetDenyHandler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.log.Warn("console: cross-origin request refused", zap.String("method", r.Method), zap.String("path", r.URL.Path),
			zap.String("origin", r.Header.Get("Origin")))
		http.Error(w, "cross-origin request refused", http.StatusForbidden)
	}))
	cop.Handler(s.mux).ServeHTTP(w, r)
}

// identity is who the request acts as ("" for nobody). ok is false when the
// console requires a proxy's header and the request lacks it.
func (s *Server) identity(r *http.Request) (who string, ok bool) {
	if h := s.cfg.OperatorHeader; h != "" {
		who = strings.TrimSpace(r.Header.Get(h))
		return who, who != ""
	}
	return s.cfg.Operator, true
}

// csrfToken is the form token of identity who: an HMAC of it under the
// process's secret, so a token is good only for its own identity and dies
// with the process.
func (s *Server) csrfToken(who string) string {
	m := hmac.New(sha256.New, s.secret)
	m.Write([]byte("idemd-console-csrf\x00" + who))
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

// view is what every page template gets.
type view struct {
	Title    string
	Nav      string
	Operator string
	CanAct   bool
	WhyNot   string // why actions are off
	CSRF     string
	Message  string
	Error    string
	River    bool
	Data     any
}

type handler func(w http.ResponseWriter, r *http.Request, v *view) error

// httpError is an error with the status the page answers.
type httpError struct {
	code int
	msg  string
}

func (e *httpError) Error() string { return e.msg }

func statusFor(err error) int {
	var he *httpError
	switch {
	case errors.As(err, &he):
		return he.code
	case errors.Is(err, operator.ErrNotFound):
		return http.StatusNotFound
	case errors.Is(err, operator.ErrRefused):
		return http.StatusConflict
	}
	return http.StatusInternalServerError
}

// page wraps a handler: identity, security headers, the common view, and
// errors rendered as a page.
func (s *Server) page(h handler) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		hd := w.Header()
		hd.Set("Content-Security-Policy", "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
		hd.Set("X-Frame-Options", "DENY")
		hd.Set("X-Content-Type-Options", "nosniff")
		hd.Set("Referrer-Policy", "no-referrer")
		hd.Set("Cache-Control", "no-store")
		who, ok := s.identity(r)
		if !ok {
			http.Error(w, "no operator identity: this console is served behind an authenticating proxy that sets "+s.cfg.OperatorHeader, http.StatusUnauthorized)
			return
		}
		v := &view{Operator: who, River: s.cfg.River != nil, Message: r.URL.Query().Get("msg")}
		switch {
		case s.cfg.ReadOnly:
			v.WhyNot = "read-only console (--read-only)"
		case who == "":
			v.WhyNot = "read-only: no operator identity (start the console with --operator or --operator-header)"
		default:
			v.CanAct = true
			v.CSRF = s.csrfToken(who)
		}
		if err := h(w, r, v); err != nil {
			code := statusFor(err)
			if code == http.StatusInternalServerError {
				s.log.Error("console: request failed", zap.String("path", r.URL.Path), zap.Error(err))
			}
			v.Title, v.Error, v.Data = http.StatusText(code), err.Error(), nil
			s.render(w, code, "error", v)
		}
	}
}

// action wraps a state-changing handler: an identity, not read-only, and
// the form's CSRF token.
func (s *Server) action(h handler) handler {
	return func(w http.ResponseWriter, r *http.Request, v *view) error {
		if !v.CanAct {
			return &httpError{http.StatusForbidden, "action refused: " + v.WhyNot}
		}
		if err := r.ParseForm(); err != nil {
			return &httpError{http.StatusBadRequest, "bad form: " + err.Error()}
		}
		if !hmac.Equal([]byte(r.PostForm.Get("csrf")), []byte(v.CSRF)) {
			s.log.Warn("console: action without a valid CSRF token refused", zap.String("path", r.URL.Path), zap.String("operator", v.Operator))
			return &httpError{http.StatusForbidden, "action refused: missing or invalid CSRF token (reload the page and try again)"}
		}
		return h(w, r, v)
	}
}

// redirect sends the browser to path with a message (after a POST, so a
// reload does not repeat the action).
func redirect(w http.ResponseWriter, r *http.Request, path, msg string) error {
	if back := r.PostForm.Get("return"); strings.HasPrefix(back, "/") && !strings.HasPrefix(back, "//") && !strings.Contains(back, "\\") {
		path = back
	}
	u, err := url.Parse(path)
	if err != nil {
		return err
	}
	q := u.Query()
	q.Set("msg", msg)
	u.RawQuery = q.Encode()
	http.Redirect(w, r, u.String(), http.StatusSeeOther)
	return nil
}

func (s *Server) render(w http.ResponseWriter, code int, name string, v *view) {
	t, ok := s.pages[name]
	if !ok {
		http.Error(w, "no template "+name, http.StatusInternalServerError)
		return
	}
	var b strings.Builder
	if err := t.ExecuteTemplate(&b, "layout", v); err != nil {
		s.log.Error("console: render", zap.String("page", name), zap.Error(err))
		http.Error(w, "render failed", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(code)
	_, _ = w.Write([]byte(b.String()))
}

func pathID(r *http.Request) (int64, error) {
	id, err := strconv.ParseInt(r.PathValue("id"), 10, 64)
	if err != nil || id < 1 {
		return 0, &httpError{http.StatusBadRequest, "the id must be a positive number"}
	}
	return id, nil
}

// note is the action's required note from the form.
func note(r *http.Request) (string, error) {
	n := strings.TrimSpace(r.PostForm.Get("note"))
	if n == "" {
		return "", &httpError{http.StatusBadRequest, "a note is required: say why this is safe now"}
	}
	return n, nil
}

func (s *Server) actor(v *view) operator.Actor {
	return operator.Actor{By: v.Operator, Via: operator.ViaConsole}
}

// river serves riverui under /river/. Its reads pass; its own
// state-changing API calls pass only with --river-actions and an operator
// identity, and are logged with who (riverui does not record them).
func (s *Server) river(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		who, ok := s.identity(r)
		if !ok {
			http.Error(w, "no operator identity", http.StatusUnauthorized)
			return
		}
		switch r.Method {
		case http.MethodGet, http.MethodHead, http.MethodOptions:
		default:
			if !s.cfg.RiverActions || s.cfg.ReadOnly || who == "" {
				http.Error(w, "River job actions are off in this console (start it with --river-actions and an operator identity)", http.StatusForbidden)
				return
			}
			s.log.Info("console: River UI action", zap.String("operator", who), zap.String("method", r.Method), zap.String("path", r.URL.Path))
		}
		h.ServeHTTP(w, r)
	})
}

// pretty indents JSON for a <pre>, numbers as they are.
func pretty(raw json.RawMessage) string {
	if len(raw) == 0 {
		return ""
	}
	var b bytes.Buffer
	if err := json.Indent(&b, raw, "", "  "); err != nil {
		return string(raw)
	}
	return b.String()
}
