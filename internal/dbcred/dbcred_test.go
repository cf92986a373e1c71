package dbcred

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
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
	f := NewFile(path, "", zap.New(core))
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
		"cannot read the database credentials file; new connections fail until it is readable",
		"cannot read the database credentials file; new connections fail until it is readable",
		"the database credentials file is readable again",
		"the database credentials file changed; new connections use the new credentials",
	}
	if strings.Join(msgs, "\n") != strings.Join(want, "\n") {
		t.Errorf("logged:\n%s\nwant:\n%s", strings.Join(msgs, "\n"), strings.Join(want, "\n"))
	}
}

// TestUserFile: with a user file, each connection takes its user and its
// password from the files, replacing the URL's; a change of either is
// logged once; a missing user file fails the connection like a missing
// password file.
func TestUserFile(t *testing.T) {
	core, logs := observer.New(zap.InfoLevel)
	dir := t.TempDir()
	pwPath, userPath := filepath.Join(dir, "password"), filepath.Join(dir, "username")
	f := NewFile(pwPath, userPath, zap.New(core))
	write := func(path, s string) {
		t.Helper()
		if err := os.WriteFile(path, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	connect := func() (*pgx.ConnConfig, error) {
		cc, err := pgx.ParseConfig("postgres://from_url:from-url@127.0.0.1/d")
		if err != nil {
			t.Fatal(err)
		}
		return cc, f.BeforeConnect(context.Background(), cc)
	}
	write(pwPath, "secret-a\n")
	if _, err := connect(); err == nil || !strings.Contains(err.Error(), "--database-user-file") {
		t.Fatalf("missing user file: err %v", err)
	}
	write(userPath, "idemd_runtime_a\n")
	if cc, err := connect(); err != nil || cc.User != "idemd_runtime_a" || cc.Password != "secret-a" {
		t.Fatalf("connect: %v, %+v", err, cc)
	}
	// A rotation to the other role: both change, logged once.
	write(userPath, "idemd_runtime_b\n")
	write(pwPath, "secret-b\n")
	for range 2 {
		if cc, err := connect(); err != nil || cc.User != "idemd_runtime_b" || cc.Password != "secret-b" {
			t.Fatalf("connect: %v, %+v", err, cc)
		}
	}
	if got := testutil.ToFloat64(f.errors); got != 1 {
		t.Errorf("errors counted %v, want 1", got)
	}
	changed := logs.FilterMessage("the database credentials file changed; new connections use the new credentials").Len()
	if changed != 1 {
		t.Errorf("the change logged %d times, want once", changed)
	}
}

// TestTornRead: a user file that changes between the reads around the
// password (a Secret's files swapped mid-read) is read again, so the
// pair comes from one version; one that never stops changing fails the
// connection, counted, rather than pairing a user with another's password.
func TestTornRead(t *testing.T) {
	f := NewFile("password", "username", nil)
	version := 0 // of the files' content; the user read bumps it when torn
	tear := 1    // how many reads of the user the swap falls behind
	userReads := 0
	f.readFile = func(path string) ([]byte, error) {
		switch path {
		case "username":
			userReads++
			if tear > 0 && userReads == 2 {
				// The swap lands between the password's read and the
				// user's second read.
				version++
				tear--
			}
			return fmt.Appendf(nil, "user_v%d\n", version), nil
		default:
			return fmt.Appendf(nil, "password_v%d\n", version), nil
		}
	}
	user, pw, err := f.ReadCredentials()
	if err != nil || user != "user_v1" || pw != "password_v1" {
		t.Fatalf("after a torn read: %q %q %v; want the pair of version 1", user, pw, err)
	}

	// Changing at every read: refused after tornReads attempts.
	f.readFile = func(path string) ([]byte, error) {
		version++
		return fmt.Appendf(nil, "v%d", version), nil
	}
	if _, _, err := f.ReadCredentials(); err == nil || !strings.Contains(err.Error(), "changed at each") {
		t.Fatalf("a user file changing at every read: err %v", err)
	}
	if got := testutil.ToFloat64(f.errors); got != 1 {
		t.Errorf("errors counted %v, want 1", got)
	}
}

// TestRefusals: every refused login is counted; the log says it once per
// credential refused, without the password, and once when a login is
// accepted again; failures that are not about credentials are left to the
// caller.
func TestRefusals(t *testing.T) {
	core, logs := observer.New(zap.InfoLevel)
	r := NewRefusals(zap.New(core))
	login := func(user, pw string, err error) {
		cc, perr := pgx.ParseConfig("postgres://127.0.0.1/d")
		if perr != nil {
			t.Fatal(perr)
		}
		cc.User, cc.Password = user, pw
		ctx := r.TraceConnectStart(context.Background(), pgx.TraceConnectStartData{ConnConfig: cc})
		r.TraceConnectEnd(ctx, pgx.TraceConnectEndData{Err: err})
	}
	refused := fmt.Errorf("connect: %w", &pgconn.PgError{Code: "28P01", Message: "password authentication failed for user \"idemd_runtime\""})
	noEntry := &pgconn.PgError{Code: "28000", Message: "no pg_hba.conf entry"}
	down := errors.New("dial tcp 127.0.0.1:5432: connect: connection refused")

	login("idemd_runtime", "secret-old", nil)
	for range 3 {
		login("idemd_runtime", "secret-old", refused) // rotated in place: the file lags
	}
	login("idemd_runtime", "secret-new", nil)
	login("idemd_runtime", "secret-new", down)
	login("idemd_other", "secret-x", noEntry)

	if got := testutil.ToFloat64(r.counter); got != 4 {
		t.Errorf("refusals counted %v, want 4 (not the connection that never reached the server)", got)
	}
	var msgs []string
	for _, e := range logs.All() {
		msgs = append(msgs, e.Message)
		for _, fld := range e.Context {
			if strings.Contains(fld.String, "secret-") {
				t.Errorf("a log line carries the password: %s %v", e.Message, fld)
			}
		}
	}
	refusedMsg := "the database refused a new connection's credentials; connections already open keep working, new ones fail until the credentials are valid again (a password changed before its file, an expired token)"
	want := []string{refusedMsg, "the database accepts new connections' credentials again", refusedMsg}
	if strings.Join(msgs, "\n") != strings.Join(want, "\n") {
		t.Errorf("logged:\n%s\nwant:\n%s", strings.Join(msgs, "\n"), strings.Join(want, "\n"))
	}
	if !isRefusal(refused) || isRefusal(down) || isRefusal(nil) {
		t.Error("isRefusal: wrong classification")
	}
}
