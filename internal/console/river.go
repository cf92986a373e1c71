package console

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"riverqueue.com/riverui"
)

// RiverPrefix is where River's own UI is mounted.
const RiverPrefix = "/river"

// NewRiverUI builds riverui's handler on pool, served under RiverPrefix,
// and starts its background services, which stop when ctx ends. The River
// client it needs works no jobs: like the enqueuer's, it only reads and
// (for riverui's own actions, if the console lets them through) changes
// river_job rows.
func NewRiverUI(ctx context.Context, pool *pgxpool.Pool, logger *slog.Logger) (http.Handler, error) {
	client, err := river.NewClient(riverpgxv5.New(pool), &river.Config{Logger: logger})
	if err != nil {
		return nil, fmt.Errorf("console: river client: %w", err)
	}
	h, err := riverui.NewHandler(&riverui.HandlerOpts{
		Endpoints: riverui.NewEndpoints(client, nil),
		Logger:    logger,
		Prefix:    RiverPrefix,
	})
	if err != nil {
		return nil, fmt.Errorf("console: river ui: %w", err)
	}
	if err := h.Start(ctx); err != nil {
		return nil, fmt.Errorf("console: river ui: %w", err)
	}
	return h, nil
}
