package completer

import (
	"bytes"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemd/idemd/internal/config"
	"github.com/idemd/idemd/internal/daemon"
	"github.com/idemd/idemd/internal/testing/dbtest"
)

func writeSecret(t *testing.T, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(p, []byte(content+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestCommandBadConfigListsEveryProblem(t *testing.T) {
	short := writeSecret(t, "tooshort-SENTINEL")
	var out, errb bytes.Buffer
	code := daemon.MainWith("completer", Description, &Command{}, []string{
		"--database-url", "postgres://x@127.0.0.1:1/db", "--api-url", "ftp://nope",
		"--auth-secret-file", short, "--auth-secret-file-previous", "/does/not/exist",
		"--lease", "10s", "--request-timeout", "30s", "--concurrency", "0", "--request-encoding", "xml",
	}, &out, &errb)
	if code != daemon.ExitConfig {
		t.Fatalf("exit %d, want 2; stderr:\n%s", code, errb.String())
	}
	msg := errb.String()
	if strings.Contains(msg, "SENTINEL") {
		t.Fatal("a secret's content was printed")
	}
	// kong rejects the enum before Check runs; fix it and look at the rest.
	errb.Reset()
	code = daemon.MainWith("completer", Description, &Command{}, []string{
		"--database-url", "postgres://x@127.0.0.1:1/db", "--api-url", "ftp://nope",
		"--auth-secret-file", short, "--auth-secret-file-previous", "/does/not/exist",
		"--lease", "10s", "--request-timeout", "30s", "--concurrency", "0",
	}, &out, &errb)
	msg = errb.String()
	if code != daemon.ExitConfig {
		t.Fatalf("exit %d", code)
	}
	for _, want := range []string{"--api-url", "--auth-secret-file:", "--auth-secret-file-previous:", "--lease", "--concurrency"} {
		if !strings.Contains(msg, want) {
			t.Errorf("stderr does not mention %s:\n%s", want, msg)
		}
	}
	if strings.Contains(msg, "SENTINEL") {
		t.Fatal("a secret's content was printed")
	}
}

func TestCommandOnceDrainsAndExitsZero(t *testing.T) {
	dbURL := dbtest.NewDatabase(t)
	pool, err := pgxpool.New(t.Context(), dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	insertKeys(t, pool, "cli", 30, "started")
	api := newTestAPI(t, pool, always(actFinish))
	var out, errb bytes.Buffer
	code := daemon.MainWith("completer", Description, &Command{}, []string{
		"--database-url", dbURL, "--api-url", api.srv.URL, "--auth-secret-file", writeSecret(t, testSecret),
		"--grace", "0s", "--idle", "0s", "--lock-timeout", "0s", "--once", "--http-addr", "", "--log-level", "warn",
	}, &out, &errb)
	if code != daemon.ExitOK {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	if n := countWhere(t, pool, "recovery_point = 'finished'"); n != 30 {
		t.Fatalf("%d finished", n)
	}
}

// The flags' defaults are DefaultSettings, by construction (FlagDefaults).
func TestFlagDefaultsAreDefaultSettings(t *testing.T) {
	var c Command
	if _, err := config.Parse("completer", Description, &c, []string{
		"--database-url", "postgres://x@127.0.0.1:1/db", "--api-url", "http://api.example", "--auth-secret-file", writeSecret(t, testSecret),
	}, io.Discard); err != nil {
		t.Fatal(err)
	}
	want := DefaultSettings()
	want.APIURL = "http://api.example"
	if c.Settings != want {
		t.Fatalf("parsed settings\n%+v\nwant DefaultSettings\n%+v", c.Settings, want)
	}
}
