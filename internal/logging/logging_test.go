package logging

import (
	"bytes"
	"encoding/json"
	"errors"
	"regexp"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// logTo builds a logger of format into a buffer.
func logTo(t *testing.T, format string, color bool) (*zap.Logger, *bytes.Buffer) {
	t.Helper()
	var buf bytes.Buffer
	l, err := build(format, "debug", zapcore.AddSync(&buf), color)
	if err != nil {
		t.Fatal(err)
	}
	return l, &buf
}

// jsonLines decodes every line of buf as one JSON object.
func jsonLines(t *testing.T, buf *bytes.Buffer) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, line := range strings.Split(strings.TrimRight(buf.String(), "\n"), "\n") {
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("not one JSON object a line: %q: %v", line, err)
		}
		out = append(out, m)
	}
	return out
}

// An error line (each retry while the database is down writes one) carries
// the error, not a stack trace.
func TestJSONErrorHasNoStacktrace(t *testing.T) {
	l, buf := logTo(t, "json", false)
	l.Error("drain failed", zap.Error(errors.New("dial tcp 127.0.0.1:5432: connect: connection refused")))
	l.Warn("retrying")
	for _, m := range jsonLines(t, buf) {
		if st, ok := m["stacktrace"]; ok {
			t.Errorf("%s line has a stacktrace: %v", m["level"], st)
		}
	}
}

// A DPanic is a bug: it keeps its stack trace (and, outside development
// mode, does not panic).
func TestJSONDPanicHasStacktrace(t *testing.T) {
	l, buf := logTo(t, "json", false)
	l.DPanic("impossible state")
	lines := jsonLines(t, buf)
	if len(lines) != 1 || lines[0]["stacktrace"] == nil {
		t.Errorf("DPanic line %v: want a stacktrace", lines)
	}
}

// Durations print with their unit in both formats ("retention":259200 read
// as anything from seconds to milliseconds).
func TestDurationsHaveUnits(t *testing.T) {
	l, buf := logTo(t, "json", false)
	l.Info("reaper run summary", zap.Duration("retention", 72*time.Hour), zap.Duration("poll_interval", 2*time.Second))
	m := jsonLines(t, buf)[0]
	if m["retention"] != "72h0m0s" || m["poll_interval"] != "2s" {
		t.Errorf("JSON durations: retention=%#v poll_interval=%#v, want \"72h0m0s\" and \"2s\"", m["retention"], m["poll_interval"])
	}

	l, buf = logTo(t, "console", false)
	l.Info("enqueuer started", zap.Duration("poll_interval", 2*time.Second))
	if !strings.Contains(buf.String(), `"poll_interval": "2s"`) {
		t.Errorf("console duration: %q, want poll_interval 2s", buf.String())
	}
}

// A console WARN or ERROR is one line: no stack trace under it. Its time is
// ISO8601 and its caller short.
func TestConsoleOneLineNoStacktrace(t *testing.T) {
	l, buf := logTo(t, "console", false)
	l.Warn("listener lost", zap.Error(errors.New("conn closed")))
	l.Error("batch failed", zap.Error(errors.New("timeout")))
	lines := strings.Split(strings.TrimRight(buf.String(), "\n"), "\n")
	if len(lines) != 2 {
		t.Fatalf("2 log calls wrote %d lines (a stack trace?):\n%s", len(lines), buf.String())
	}
	line := regexp.MustCompile(`^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}[Z+-][0-9:]*\tWARN\tlogging/logging_test\.go:\d+\tlistener lost\t\{"error": "conn closed"\}$`)
	if !line.MatchString(lines[0]) {
		t.Errorf("console WARN line %q, want ISO8601 time, WARN, short caller, message, fields", lines[0])
	}
	if strings.Contains(buf.String(), "\x1b[") {
		t.Errorf("colour escapes written to a non-terminal: %q", buf.String())
	}
}

// Colour only where New found a terminal.
func TestConsoleColorOnlyForTerminal(t *testing.T) {
	l, buf := logTo(t, "console", true)
	l.Warn("x")
	if !strings.Contains(buf.String(), "\x1b[") {
		t.Errorf("no colour escape with color on: %q", buf.String())
	}
}

// River's slog errors go through the same core, also without stack traces.
func TestSlogErrorHasNoStacktrace(t *testing.T) {
	l, buf := logTo(t, "json", false)
	Slog(l).Error("river: fetch failed", "error", "connection refused")
	for _, m := range jsonLines(t, buf) {
		if _, ok := m["stacktrace"]; ok {
			t.Errorf("slog error line has a stacktrace: %v", m)
		}
		if m["msg"] != "river: fetch failed" {
			t.Errorf("slog line %v", m)
		}
	}
}

func TestUnknownFormatAndLevel(t *testing.T) {
	if _, err := New("xml", "info"); err == nil {
		t.Error("format xml accepted")
	}
	if _, err := New("json", "loud"); err == nil {
		t.Error("level loud accepted")
	}
}
