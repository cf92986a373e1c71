package dbcred

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
)

// TestFile: the password is read afresh at each connection without its
// line break; a change is logged once, a failure is logged once per
// distinct error and counted each time; no log line carries the password.
func TestFile(t *testing.T) {
	core, logs := observer.New(zap.InfoLevel)
	path := filepath.Join(t.TempDir(), "password")
	f := NewFile(path, zap.New(core))
	ctx := context.Background()
	write := func(s string) {
		t.Helper()
		if err := os.WriteFile(path, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	connect := func() (string, error) {
		cc, err := pgx.ParseConfig("postgres://u:from-url@127.0.0.1/d")
		if err != nil {
			t.Fatal(err)
		}
		err = f.BeforeConnect(ctx, cc)
		return cc.Password, err
	}

	// Missing, twice: counted twice, logged once.
	for range 2 {
		if _, err := connect(); err == nil || !strings.Contains(err.Error(), "--database-password-file") {
			t.Fatalf("missing file: err %v", err)
		}
	}
	write("\n")
	if _, err := connect(); err == nil || !strings.Contains(err.Error(), "empty") {
		t.Fatalf("empty file: err %v", err)
	}
	if got := testutil.ToFloat64(f.errors); got != 3 {
		t.Errorf("errors counted %v, want 3", got)
	}
	write("secret-one\n")
	for range 3 {
		if pw, err := connect(); err != nil || pw != "secret-one" {
			t.Fatalf("password %q, %v; want secret-one (the URL's is replaced)", pw, err)
		}
	}
	write("secret-two\r\n")
	for range 3 {
		if pw, err := connect(); err != nil || pw != "secret-two" {
			t.Fatalf("password %q, %v; want secret-two", pw, err)
		}
	}

	var msgs []string
	for _, e := range logs.All() {
		line := e.Message
		for _, fld := range e.Context {
			line += " " + fld.String
			if err, ok := fld.Interface.(error); ok {
				line += " " + err.Error()
			}
		}
		if strings.Contains(line, "secret-") {
			t.Errorf("a log line carries the password: %s", line)
		}
		msgs = append(msgs, e.Message)
	}
	want := []string{
		"cannot read the database password file; new connections fail until it is readable",
		"cannot read the database password file; new connections fail until it is readable",
		"the database password file is readable again",
		"the database password file changed; new connections use the new password",
	}
	if strings.Join(msgs, "\n") != strings.Join(want, "\n") {
		t.Errorf("logged:\n%s\nwant:\n%s", strings.Join(msgs, "\n"), strings.Join(want, "\n"))
	}
}
