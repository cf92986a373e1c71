// Package logging builds the zap logger every command uses and bridges
// River's slog output into it, so one process writes one log stream.
//
// Conventions for fields, so a line reads without the code at hand:
// durations are zap.Duration and print with their unit ("72h0m0s",
// "1.5s") in both formats; sizes and other quantities with a unit carry it
// in the field name (max_args_bytes).
package logging

import (
	"fmt"
	"log/slog"
	"math"
	"os"

	"go.uber.org/zap"
	"go.uber.org/zap/exp/zapslog"
	"go.uber.org/zap/zapcore"
)

// stackLevel is the lowest level whose lines carry a stack trace. Errors
// here are expected operating conditions (a database restart logs one per
// retry) whose message already says where: a ~600-character trace on each
// buries the log. A DPanic or panic is a bug, and gets one.
const stackLevel = zapcore.DPanicLevel

// New returns a zap logger writing to stderr. format is "json" (production:
// one JSON object a line) or "console" (for a terminal: levels in colour
// when stderr is one). Both print ISO8601 times, short callers and
// durations with their unit. Sampling is off: an operator looking for one
// key's log line must find it.
func New(format, level string) (*zap.Logger, error) {
	return build(format, level, zapcore.Lock(os.Stderr), isTerminal(os.Stderr))
}

// build is New with the destination and colouring explicit (for tests).
func build(format, level string, out zapcore.WriteSyncer, color bool) (*zap.Logger, error) {
	lvl, err := zapcore.ParseLevel(level)
	if err != nil {
		return nil, fmt.Errorf("logging: level: %w", err)
	}
	ec := zap.NewProductionEncoderConfig()
	ec.EncodeTime = zapcore.ISO8601TimeEncoder
	ec.EncodeDuration = zapcore.StringDurationEncoder
	ec.EncodeCaller = zapcore.ShortCallerEncoder
	var enc zapcore.Encoder
	switch format {
	case "json", "":
		enc = zapcore.NewJSONEncoder(ec)
	case "console":
		ec.EncodeLevel = zapcore.CapitalLevelEncoder
		if color {
			// Escape codes only for a terminal: in a file or a pipe they
			// are noise around every level.
			ec.EncodeLevel = zapcore.CapitalColorLevelEncoder
		}
		enc = zapcore.NewConsoleEncoder(ec)
	default:
		return nil, fmt.Errorf("logging: unknown format %q", format)
	}
	core := zapcore.NewCore(enc, out, zap.NewAtomicLevelAt(lvl))
	// Not zap's development mode, even for the console: it would turn a
	// DPanic into a crash of a production daemon run with --log-format
	// console.
	return zap.New(core, zap.AddCaller(), zap.AddStacktrace(stackLevel), zap.ErrorOutput(zapcore.Lock(os.Stderr))), nil
}

// isTerminal reports whether f is a character device (a terminal), without
// a dependency for it.
func isTerminal(f *os.File) bool {
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

// noSlogStacks is above every slog level: River logs its retries at
// slog.LevelError, which zapslog would give a stack trace by default, and
// slog has no panic level to keep them for.
const noSlogStacks = slog.Level(math.MaxInt)

// Slog returns an slog.Logger writing through l (for River).
func Slog(l *zap.Logger) *slog.Logger {
	return slog.New(zapslog.NewHandler(l.Core(), zapslog.WithCaller(false), zapslog.AddStacktraceAt(noSlogStacks)))
}
