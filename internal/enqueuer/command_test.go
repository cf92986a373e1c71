package enqueuer

import (
	"errors"
	"io"
	"reflect"
	"testing"

	"github.com/idemd/idemd/internal/config"
)

// The flags' defaults are DefaultSettings, by construction (FlagDefaults).
func TestFlagDefaultsAreDefaultSettings(t *testing.T) {
	var c Command
	if _, err := config.Parse("enqueuer", Description, &c, []string{"--database-url", "postgres://x@127.0.0.1:1/db"}, io.Discard); err != nil {
		t.Fatal(err)
	}
	if want := DefaultSettings(); !reflect.DeepEqual(c.Settings, want) {
		t.Fatalf("parsed settings\n%+v\nwant DefaultSettings\n%+v", c.Settings, want)
	}
}

// The command's rules are the settings' (Settings.Check), named by flag:
// the command adds none of its own.
func TestCommandCheckIsSettingsCheck(t *testing.T) {
	var c Command
	_, err := config.Parse("enqueuer", Description, &c, []string{"--database-url", "postgres://x@127.0.0.1:1/db",
		"--batch-size", "0", "--workers", "65", "--listen-database-url", "postgres://u@h/d", "--poll-only"}, io.Discard)
	var ce *config.Error
	want := []string{
		"--batch-size must be between 1 and 100000, got 0",
		"--workers must be between 1 and 64, got 65",
		"--listen-database-url and --poll-only contradict each other",
	}
	if !errors.As(err, &ce) || !reflect.DeepEqual(ce.Problems, want) || !reflect.DeepEqual(c.Check(), c.Settings.Check()) {
		t.Fatalf("problems %v, want %q (Command.Check %q, Settings.Check %q)", err, want, c.Check(), c.Settings.Check())
	}
}
