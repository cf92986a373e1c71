// Package logging builds the zap logger every command uses and bridges
// River's slog output into it, so one process writes one log stream.
package logging

import (
	"fmt"
	"log/slog"

	"go.uber.org/zap"
	"go.uber.org/zap/exp/zapslog"
	"go.uber.org/zap/zapcore"
)

// New returns a zap logger. format is "json" (production: one JSON object a
// line, ISO8601 times) or "console". Sampling is off: an operator looking for
// one key's log line must find it.
func New(format, level string) (*zap.Logger, error) {
	lvl, err := zapcore.ParseLevel(level)
	if err != nil {
		return nil, fmt.Errorf("logging: level: %w", err)
	}
	var cfg zap.Config
	switch format {
	case "json", "":
		cfg = zap.NewProductionConfig()
		cfg.EncoderConfig.EncodeTime = zapcore.ISO8601TimeEncoder
	case "console":
		cfg = zap.NewDevelopmentConfig()
	default:
		return nil, fmt.Errorf("logging: unknown format %q", format)
	}
	cfg.Sampling = nil
	cfg.Level = zap.NewAtomicLevelAt(lvl)
	cfg.OutputPaths = []string{"stderr"}
	l, err := cfg.Build()
	if err != nil {
		return nil, fmt.Errorf("logging: build: %w", err)
	}
	return l, nil
}

// Slog returns an slog.Logger writing through l (for River).
func Slog(l *zap.Logger) *slog.Logger {
	return slog.New(zapslog.NewHandler(l.Core(), zapslog.WithCaller(false)))
}
