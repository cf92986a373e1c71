package ctl_test

import (
	"bytes"
	"io"
	"net/http"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/idemd/idemd/internal/ctl"
	"github.com/idemd/idemd/internal/testing/testwait"
)

// syncBuffer is a bytes.Buffer safe to read while the command writes.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestConsoleServesAndStopsOnSIGTERM runs `idemctl console` as its main
// does: it serves the status page, and SIGTERM stops it with exit 0.
func TestConsoleServesAndStopsOnSIGTERM(t *testing.T) {
	url, _ := setup(t)
	var out, errb syncBuffer
	done := make(chan int, 1)
	go func() {
		done <- ctl.Main([]string{"--database-url", url, "--log-format", "console", "console", "--listen", "127.0.0.1:0", "--operator", "alice"}, &out, &errb)
	}()
	addr := regexp.MustCompile(`serving on (http://\S+/)`)
	var base string
	testwait.Until(t, 30*time.Second, "the console to serve", func() bool {
		select {
		case code := <-done:
			t.Fatalf("console exited %d early: %s%s", code, out.String(), errb.String())
		default:
		}
		m := addr.FindStringSubmatch(out.String())
		if m != nil {
			base = m[1]
		}
		return m != nil
	})
	resp, err := http.Get(base)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), "acting as <strong>alice</strong>") || !strings.Contains(string(body), `id="staged-jobs">0<`) {
		t.Fatalf("status page: %d\n%s", resp.StatusCode, body)
	}
	if err := syscall.Kill(syscall.Getpid(), syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case code := <-done:
		if code != 0 {
			t.Fatalf("exit %d after SIGTERM: %s", code, errb.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatal("console did not stop on SIGTERM")
	}
	if _, err := http.Get(base); err == nil {
		t.Fatal("still serving after SIGTERM")
	}
}

func TestConsoleFlags(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--listen", "0.0.0.0:8080"}, "not a loopback address"},
		{[]string{"--listen", "10.0.0.5:8080", "--operator", "a"}, "--operator-header"},
		{[]string{"--operator", "a", "--operator-header", "X-Forwarded-Email"}, "exclude each other"},
		{[]string{"--listen", "nope"}, "--listen"},
	} {
		code, _, errs := run(t, append([]string{"--database-url", "postgres://x/y", "console"}, c.args...)...)
		if code != 2 || !strings.Contains(errs, c.want) {
			t.Errorf("%v: exit %d, want 2 with %q: %s", c.args, code, c.want, errs)
		}
	}
}
