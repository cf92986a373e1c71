package dbcred

import (
	"context"
	"crypto/sha256"
	"errors"
	"sync"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
)

// Refusals watches every new connection (a pgx ConnectTracer) for the
// server refusing its credentials, which PostgreSQL reports only at login:
// a password rotated in place before the file was rewritten, an expired
// token, a role that may not log in. Each refused connection is counted;
// the log says so once per credential refused (never the password) and
// once when a connection is accepted again, so a rotation's window shows
// as two lines however many connections it cost.
type Refusals struct {
	logger  *zap.Logger
	counter prometheus.Counter

	mu      sync.Mutex
	last    [sha256.Size]byte // the credential last logged as refused
	refused bool              // the last connection that ended was refused
}

// NewRefusals returns a Refusals. A nil logger logs nothing.
func NewRefusals(logger *zap.Logger) *Refusals {
	if logger == nil {
		logger = zap.NewNop()
	}
	return &Refusals{
		logger: logger,
		counter: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "idemd_database_auth_failures_total",
			Help: "New database connections the server refused for their credentials (SQLSTATE 28P01 or 28000): a password rotated before its file, an expired token, a role that may not log in.",
		}),
	}
}

// Collector is the counter of refused connections, for the daemon's
// registry.
func (r *Refusals) Collector() prometheus.Collector { return r.counter }

type credentialKey struct{}

// credential identifies what a connection authenticates with, without
// keeping the password itself.
type credential struct {
	user string
	sum  [sha256.Size]byte
}

// TraceConnectStart notes the credential the connection is about to try:
// BeforeConnect has already set it.
func (r *Refusals) TraceConnectStart(ctx context.Context, data pgx.TraceConnectStartData) context.Context {
	c := credential{user: data.ConnConfig.User, sum: sha256.Sum256([]byte(data.ConnConfig.User + "\x00" + data.ConnConfig.Password))}
	return context.WithValue(ctx, credentialKey{}, c)
}

// TraceConnectEnd counts and logs a refusal, and says when the server
// accepts a connection again after one.
func (r *Refusals) TraceConnectEnd(ctx context.Context, data pgx.TraceConnectEndData) {
	c, _ := ctx.Value(credentialKey{}).(credential)
	refused := isRefusal(data.Err)
	if data.Err != nil && !refused {
		return // not about credentials: the pool's callers report it
	}
	if refused {
		r.counter.Inc()
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	switch {
	case refused && (!r.refused || c.sum != r.last):
		r.last = c.sum
		r.logger.Warn("the database refused a new connection's credentials; connections already open keep working, new ones fail until the credentials are valid again (a password changed before its file, an expired token)",
			zap.String("user", c.user), zap.Error(data.Err))
	case !refused && r.refused:
		r.logger.Info("the database accepts new connections' credentials again", zap.String("user", c.user))
	}
	r.refused = refused
}

// isRefusal reports whether err is the server refusing a login's
// credentials: invalid_password (28P01) or
// invalid_authorization_specification (28000: no pg_hba.conf entry, a role
// that may not log in).
func isRefusal(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && (pgErr.Code == "28P01" || pgErr.Code == "28000")
}
