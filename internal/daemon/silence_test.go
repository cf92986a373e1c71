package daemon_test

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/idemd/idemd/internal/config"
	"github.com/idemd/idemd/internal/daemon"
	"github.com/idemd/idemd/internal/dbcall"
	"github.com/idemd/idemd/internal/testing/blackhole"
	"github.com/idemd/idemd/internal/testing/dbtest"
	"github.com/idemd/idemd/internal/testing/tcpproxy"
	"github.com/idemd/idemd/internal/testing/testwait"
)

// TestProbesDuringASilentFault: the enqueuer and the completer, reaching
// PostgreSQL through a network that goes silent, say not ready naming the
// call the database did not answer, stay live (/healthz: a restart cannot
// fix the network), log the fault once when it begins and once when it
// ends, with no error line per failed attempt, count the calls, and are
// ready again once the network forwards, without a restart.
func TestProbesDuringASilentFault(t *testing.T) {
	dbURL := dbtest.NewDatabase(t)
	hole, holeURL := blackhole.Through(t, dbURL)
	holeURL = blackhole.WithParam(holeURL, "connect_timeout", "5")
	secret := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(secret, []byte("c2VjcmV0LXNlY3JldC1zZWNyZXQtc2VjcmV0LXNlYw=="), 0o600); err != nil {
		t.Fatal(err)
	}
	// A bound short enough for the test to see several calls run out of
	// it, long enough that a loaded machine's healthy calls keep within it
	// after the fault (at 300 ms, a load of 20 on two cores did not); the
	// calls sent into the fault with longer bounds of their own (db-stats')
	// then run out after its end, which must not reopen it.
	common := []string{"--database-url", holeURL, "--database-timeout", "2s"}
	procs := []*daemonProcess{
		startDaemon(t, "enqueuer", append(common, "--listener-check-interval", "300ms", "--listener-check-timeout", "300ms")...),
		startDaemon(t, "completer", append(common, "--api-url", "http://127.0.0.1:1", "--auth-secret-file", secret, "--poll-interval", "200ms")...),
	}
	for _, p := range procs {
		testwait.Until(t, time.Minute, p.name+" ready", func() bool { code, _ := p.get("/readyz"); return code == http.StatusOK })
	}

	hole.BlackHole(tcpproxy.HoleOptions{})
	for _, p := range procs {
		testwait.Until(t, time.Minute, p.name+"'s /readyz to name the call the database did not answer", func() bool {
			if code, _ := p.get("/healthz"); code != http.StatusOK {
				t.Fatalf("%s: /healthz answered %d during a silent fault", p.name, code)
			}
			code, body := p.get("/readyz")
			return code == http.StatusServiceUnavailable &&
				strings.Contains(body, "database did not answer within 2s: "+p.name)
		})
		// Several calls ran out of their bound, and the fault was
		// logged once.
		testwait.Until(t, time.Minute, p.name+" to count its calls that timed out", func() bool {
			return p.counterSum("idemd_database_call_timeouts_total") >= 5
		})
		if v, _ := p.metric("idemd_database_unanswered"); v != 1 {
			t.Errorf("%s: idemd_database_unanswered %v during the fault, want 1", p.name, v)
		}
	}

	// The server's keepalives end the silenced sessions, as they would
	// end a vanished client's; then the network forwards again.
	hole.EndServerSessions()
	hole.Heal()
	for _, p := range procs {
		testwait.Until(t, time.Minute, p.name+" ready again after the fault", func() bool { code, _ := p.get("/readyz"); return code == http.StatusOK })
		testwait.Until(t, time.Minute, p.name+" to log that the database answers again", func() bool {
			return p.logLines("the database answers again") == 1
		})
		if n := p.logLines("did not answer a call within its bound"); n != 1 {
			t.Errorf("%s logged the start of the fault %d times, want once", p.name, n)
		}
		if n := p.errorLines(); n != 0 {
			t.Errorf("%s logged %d error lines during the fault, want none (one line when it begins, one when it ends, counters for the rest):\n%s", p.name, n, p.logs.String())
		}
		if v, _ := p.metric("idemd_database_unanswered"); v != 0 {
			t.Errorf("%s: idemd_database_unanswered %v after the fault, want 0", p.name, v)
		}
	}
	for _, p := range procs {
		p.stop(t)
	}
}

// get fetches an ops endpoint: its status and body (0 while it does not
// answer).
func (p *daemonProcess) get(path string) (int, string) {
	resp, err := http.Get("http://" + p.addr + path)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

// counterSum adds up every series of a labelled counter on /metrics.
func (p *daemonProcess) counterSum(name string) float64 {
	_, body := p.get("/metrics")
	sum := 0.0
	sc := bufio.NewScanner(strings.NewReader(body))
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, name+"{") {
			continue
		}
		if f, err := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64); err == nil {
			sum += f
		}
	}
	return sum
}

// logLines counts the log lines whose message contains msg.
func (p *daemonProcess) logLines(msg string) int {
	n := 0
	for _, l := range p.logRecords() {
		if strings.Contains(l.Msg, msg) {
			n++
		}
	}
	return n
}

// errorLines counts the log lines at error level.
func (p *daemonProcess) errorLines() int {
	n := 0
	for _, l := range p.logRecords() {
		if l.Level == "error" {
			n++
		}
	}
	return n
}

type logRecord struct {
	Level string `json:"level"`
	Msg   string `json:"msg"`
}

func (p *daemonProcess) logRecords() []logRecord {
	var recs []logRecord
	sc := bufio.NewScanner(strings.NewReader(p.logs.String()))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var r logRecord
		if json.Unmarshal(sc.Bytes(), &r) == nil {
			recs = append(recs, r)
		}
	}
	return recs
}

// NewPool's connections carry no server setting as a startup parameter,
// whatever --pooler says (PgBouncer refuses one it does not know, and a
// deployment that reaches it with --pooler none must keep connecting); the
// lock sessions set the server's keepalives themselves. connect_timeout is --database-timeout unless the
// URL sets one, and the pool pings an idle connection within a second.
func TestNewPoolBoundsEveryConnection(t *testing.T) {
	dbURL := dbtest.NewDatabase(t)
	for _, pooler := range config.Poolers {
		pool, _, err := daemon.NewPool(context.Background(), config.Database{DatabaseURL: dbURL, Pooler: pooler, Timeout: 7 * time.Second}, "idemd-test", nil)
		if err != nil {
			t.Fatal(err)
		}
		defer pool.Close()
		cfg := pool.Config()
		if cfg.ConnConfig.ConnectTimeout != 7*time.Second || cfg.PingTimeout != time.Second || cfg.ConnConfig.DialFunc == nil {
			t.Errorf("--pooler %s: connect_timeout %s, ping timeout %s: want 7s and 1s", pooler, cfg.ConnConfig.ConnectTimeout, cfg.PingTimeout)
		}
		for _, s := range dbcall.ServerKeepalives {
			var got string
			if err := pool.QueryRow(context.Background(), "SELECT current_setting($1)", s.Name).Scan(&got); err != nil {
				t.Fatal(err)
			}
			if got == s.Value {
				t.Errorf("--pooler %s: %s = %q on a pool connection, want the server's own", pooler, s.Name, got)
			}
			if _, ok := cfg.ConnConfig.RuntimeParams[s.Name]; ok {
				t.Errorf("--pooler %s: %s is a startup parameter", pooler, s.Name)
			}
		}
	}
	withOwn, _, err := daemon.NewPool(context.Background(), config.Database{DatabaseURL: blackhole.WithParam(dbURL, "connect_timeout", "3"), Pooler: config.PoolerNone, Timeout: 7 * time.Second}, "idemd-test", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer withOwn.Close()
	if got := withOwn.Config().ConnConfig.ConnectTimeout; got != 3*time.Second {
		t.Errorf("the URL's connect_timeout=3 became %s", got)
	}
}
