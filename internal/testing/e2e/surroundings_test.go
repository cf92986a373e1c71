//go:build e2e

package e2e

import (
	"context"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/idemd/idemd/internal/testing/dbtest"
	"github.com/idemd/idemd/internal/testing/e2e/oracle"
	"github.com/idemd/idemd/internal/testing/e2e/system"
	"github.com/idemd/idemd/internal/testing/scratchdb"
	"github.com/idemd/idemd/internal/testing/tcpproxy"
)

// startSurroundings starts what a run's daemons talk to, on e's database
// and binaries: the TCP proxy in front of target (PostgreSQL, or the
// PgBouncer of a pooled run), Rocket Rides with the staged-job log
// (startAPI), and the replay front before the API. It returns the daemon
// options that point at them; the caller says how many daemons of each.
func (e *env) startSurroundings(ctx context.Context, target string) system.DaemonOptions {
	t := e.t
	t.Helper()
	var err error
	if e.proxy, err = tcpproxy.New(target); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.proxy.Close() })
	u, err := url.Parse(e.dbURL)
	if err != nil {
		t.Fatal(err)
	}
	daemonURL, err := scratchdb.WithDatabase(dbtest.RuntimeURL(e.dbURL), strings.TrimPrefix(u.Path, "/"), e.proxy.Addr())
	if err != nil {
		t.Fatal(err)
	}

	secretPath, secret := e.startAPI(ctx)
	// Replays go through the front, which can hold them past the
	// completers' timeout and sign them with a skewed clock.
	if e.front, err = newReplayFront(e.rr.APIURL, secret, 3500*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	e.frontSv = httptest.NewServer(e.front)
	t.Cleanup(func() { e.frontSv.Close(); e.front.close() })
	return system.DaemonOptions{DatabaseURL: daemonURL, APIURL: e.frontSv.URL, SecretFile: secretPath}
}

// startAPI writes a fresh replay secret, starts Rocket Rides (e.bins) with
// it on e.dbURL and installs the staged-job log the oracle reads. It returns
// the secret's file, which the completers sign with, and the secret.
func (e *env) startAPI(ctx context.Context) (secretPath string, secret []byte) {
	t := e.t
	t.Helper()
	secretPath, secret, err := system.WriteSecret(e.dir, "replay-secret")
	if err != nil {
		t.Fatal(err)
	}
	// The API talks to PostgreSQL directly, never through the proxy: its
	// cuts are aimed at the daemons. A little Stripe latency lets clients
	// give up mid-charge.
	if e.rr, err = system.StartRocketRides(ctx, e.bins, system.RocketRidesOptions{
		DatabaseURL: e.dbURL, SecretFile: secretPath, StripeLatency: 30 * time.Millisecond, Dir: e.dir,
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.rr.Close)
	if err := oracle.InstallStagedLog(ctx, e.pool); err != nil {
		t.Fatal(err)
	}
	return secretPath, secret
}

// stopDaemons stops d with SIGTERM (15 s at most) and fails t for any
// daemon that did not exit 0: on SIGTERM each finishes its unit of work and
// exits cleanly. which names the set in the messages. It returns the exit
// codes.
func stopDaemons(t *testing.T, d *system.DaemonSet, which string) map[string]int {
	t.Helper()
	codes, err := d.Stop(15 * time.Second)
	if err != nil {
		t.Errorf("stopping the %s daemons: %v", which, err)
	}
	for name, code := range codes {
		if code != 0 {
			t.Errorf("the %s %s exited %d on SIGTERM, want 0 (drain and exit)", which, name, code)
		}
	}
	return codes
}
