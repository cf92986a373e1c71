package daemon

import (
	"context"
	"errors"
	"sync"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"go.uber.org/zap"
)

// poolerMismatch watches every query's error for the two SQLSTATEs a
// transaction-mode pooler produces when pgx's named prepared statements
// meet a server connection that did not prepare them (26000) or already
// has them (42P05), and says once, at error level, what the operator must
// change. The queries themselves fail and are retried as any failure is;
// this turns a baffling error into the fix.
type poolerMismatch struct {
	logger *zap.Logger
	once   sync.Once
}

func (p *poolerMismatch) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	return ctx
}

func (p *poolerMismatch) TraceQueryEnd(_ context.Context, _ *pgx.Conn, data pgx.TraceQueryEndData) {
	if isPreparedStatementMismatch(data.Err) {
		p.once.Do(func() {
			p.logger.Error("prepared statements are vanishing between queries: --database-url goes through a "+
				"transaction-mode pooler; start with --pooler transaction (IDEMD_POOLER=transaction)", zap.Error(data.Err))
		})
	}
}

// isPreparedStatementMismatch reports invalid_sql_statement_name (26000)
// and duplicate_prepared_statement (42P05).
func isPreparedStatementMismatch(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && (pgErr.Code == "26000" || pgErr.Code == "42P05")
}
