package daemon_test

import (
	"bufio"
	"io"
	"net/http"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/idemd/idemd/internal/testing/testbin"
)

// daemonProcess is a daemon built from cmd/ and run with args.
type daemonProcess struct {
	name string
	addr string
	cmd  *exec.Cmd
	logs *lockedBuffer
	done chan error
}

func startDaemon(t *testing.T, name string, args ...string) *daemonProcess {
	t.Helper()
	p := &daemonProcess{name: name, addr: closedAddr(t), logs: &lockedBuffer{}, done: make(chan error, 1)}
	p.cmd = exec.Command(testbin.Build(t, "github.com/idemd/idemd/cmd/"+name),
		append(args, "--http-addr", p.addr, "--log-format", "json")...)
	p.cmd.Stderr = p.logs
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.done <- p.cmd.Wait() }()
	t.Cleanup(func() {
		_ = p.cmd.Process.Kill()
		if t.Failed() {
			t.Logf("%s log:\n%s", name, p.logs.String())
		}
	})
	return p
}

// metric reads one unlabelled counter or gauge from the daemon's /metrics;
// ok is false while the endpoint does not answer.
func (p *daemonProcess) metric(name string) (float64, bool) {
	resp, err := http.Get("http://" + p.addr + "/metrics")
	if err != nil {
		return 0, false
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, false
	}
	sc := bufio.NewScanner(strings.NewReader(string(body)))
	for sc.Scan() {
		if v, found := strings.CutPrefix(sc.Text(), name+" "); found {
			f, err := strconv.ParseFloat(v, 64)
			return f, err == nil
		}
	}
	return 0, false
}

func (p *daemonProcess) stop(t *testing.T) {
	t.Helper()
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-p.done:
		if err != nil {
			t.Errorf("%s on SIGTERM: %v", p.name, err)
		}
	case <-time.After(time.Minute):
		t.Fatalf("%s did not exit on SIGTERM", p.name)
	}
}
