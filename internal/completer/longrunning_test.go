package completer

import (
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/idemd/idemd/internal/config"
)

// Which command lines keep the completer running (and serving :9090) and which
// do one piece of work and exit.
func TestLongRunning(t *testing.T) {
	t.Setenv("DATABASE_URL", "postgres://u@h/d")
	secret := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(secret, []byte("0123456789abcdef0123456789abcdef"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args []string
		want bool
	}{
		{nil, true},
		{[]string{"--once"}, false},
	} {
		var cmd Command
		args := append([]string{"--api-url", "http://127.0.0.1:1", "--auth-secret-file", secret}, tc.args...)
		if _, err := config.Parse("completer", "", &cmd, args, io.Discard); err != nil {
			t.Fatalf("%v: %v", tc.args, err)
		}
		if got := cmd.LongRunning(); got != tc.want {
			t.Errorf("%v: LongRunning = %v, want %v", tc.args, got, tc.want)
		}
	}
}
