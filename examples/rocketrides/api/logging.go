package api

import (
	"log/slog"

	"go.uber.org/zap"
	"go.uber.org/zap/exp/zapslog"
)

// zapSlog hands idem (which logs through slog, to stay free of zap for
// other APIs) the API's zap logger.
func zapSlog(l *zap.Logger) *slog.Logger {
	return slog.New(zapslog.NewHandler(l.Core(), zapslog.WithCaller(false)))
}
