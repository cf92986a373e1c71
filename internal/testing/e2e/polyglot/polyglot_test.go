//go:build e2e

package polyglot

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemd/idemd/clients/clienttest"
	"github.com/idemd/idemd/idem"
	"github.com/idemd/idemd/idem/replayauth"
	"github.com/idemd/idemd/internal/testing/dbtest"
	"github.com/idemd/idemd/internal/testing/replaytest"
	"github.com/idemd/idemd/internal/testing/testbin"
)

func TestMain(m *testing.M) { dbtest.Main(m) }

// lockTimeout is the API's lock timeout and the completer's --lock-timeout:
// short, so keys locked by the killed process are taken over within the
// test.
const lockTimeout = "3"

const unauthorized = `{"error":"Replay signature rejected."}`

// proc is one process the test started; only the test stops it.
type proc struct {
	name string
	cmd  *exec.Cmd
	log  string
	done chan struct{}
	err  error
}

func start(t *testing.T, dir, name, bin string, args ...string) *proc {
	t.Helper()
	logPath := filepath.Join(dir, name+".log")
	f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = f, f
	if err := cmd.Start(); err != nil {
		f.Close()
		t.Fatalf("start %s: %v", name, err)
	}
	p := &proc{name: name, cmd: cmd, log: logPath, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		f.Close()
		close(p.done)
	}()
	t.Cleanup(func() {
		p.kill()
		if t.Failed() {
			b, _ := os.ReadFile(logPath)
			if len(b) > 6000 {
				b = b[len(b)-6000:]
			}
			t.Logf("--- %s log (tail):\n%s", name, b)
		}
	})
	return p
}

func (p *proc) running() bool {
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

// kill SIGKILLs the process (if it still runs) and waits for it.
func (p *proc) kill() {
	if p.running() {
		_ = p.cmd.Process.Signal(syscall.SIGKILL)
	}
	<-p.done
}

// stop sends SIGTERM and returns the exit code.
func (p *proc) stop(t *testing.T, timeout time.Duration) int {
	t.Helper()
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(timeout):
		p.kill()
		t.Fatalf("%s did not exit within %s of SIGTERM", p.name, timeout)
	}
	var ee *exec.ExitError
	if errors.As(p.err, &ee) {
		return ee.ExitCode()
	}
	if p.err != nil {
		t.Fatalf("%s: %v", p.name, p.err)
	}
	return 0
}

func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// until polls cond until it holds or fails the test after timeout.
func until(t *testing.T, timeout time.Duration, what string, cond func() (bool, error)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	var last error
	for {
		ok, err := cond()
		if ok {
			return
		}
		if err != nil {
			last = err
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s (last error: %v)", timeout, what, last)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// reply is one HTTP answer; status 0 means the client gave up or the
// connection failed.
type reply struct {
	status   int
	body     string
	replayed bool
	err      error
}

func send(url string, timeout time.Duration, headers map[string]string, body string) reply {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		return reply{err: err}
	}
	req.Header.Set("Content-Type", "application/json")
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return reply{err: err}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return reply{status: resp.StatusCode, body: string(b), replayed: resp.Header.Get(idem.ReplayedHeader) == "true", err: err}
}

// system is the API, its database and the daemons of one run.
type system struct {
	t         *testing.T
	dir       string
	db        clienttest.DB
	admin     *pgxpool.Pool // oracle and fault setup
	api       *proc
	apiURL    string
	apiArgs   []string
	lang      lang
	secret    replayauth.Secret
	rawSecret []byte // secret's bytes, for the headers replayauth will not sign
	secretFil string
}

func (s *system) startAPI() {
	s.t.Helper()
	s.api = start(s.t, s.dir, "orders-api", s.lang.interpreter, s.apiArgs...)
	until(s.t, 30*time.Second, "the "+s.lang.name+" API to answer", func() (bool, error) {
		if !s.api.running() {
			b, _ := os.ReadFile(s.api.log)
			s.t.Fatalf("the %s API exited: %v\n%s", s.lang.name, s.api.err, b)
		}
		resp, err := http.Get(s.apiURL + "/healthz")
		if err != nil {
			return false, err
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK, nil
	})
}

func (s *system) faults(rules string) {
	s.t.Helper()
	req, _ := http.NewRequest(http.MethodPut, s.apiURL+"/_test/faults", strings.NewReader(rules))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		s.t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		s.t.Fatalf("faults: %s", resp.Status)
	}
}

// order sends POST /orders as user with key.
func (s *system) order(user int, key, sku string, qty int, timeout time.Duration) reply {
	return send(s.apiURL+"/orders", timeout, map[string]string{
		"Authorization":   fmt.Sprintf("Bearer user-%d", user),
		"Idempotency-Key": key,
	}, fmt.Sprintf(`{"sku":%q,"quantity":%d}`, sku, qty))
}

// replay sends what the completer would: the key's stored params, signed.
func (s *system) replay(header, key, body string) reply {
	return send(s.apiURL+"/orders", 10*time.Second, map[string]string{
		replayauth.Header:               header,
		replayauth.IdempotencyKeyHeader: key,
	}, body)
}

func (s *system) scalar(sql string, args ...any) int64 {
	s.t.Helper()
	var n int64
	if err := s.admin.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		s.t.Fatalf("%s: %v", sql, err)
	}
	return n
}

func (s *system) nonceRows(nonce string) int64 {
	return s.scalar(`SELECT count(*) FROM idemd_replay_nonces WHERE nonce = $1`, nonce)
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// lang is one language's example order API: the same routes, answers and
// faults in each (clients/<language>/example/).
type lang struct {
	name        string // as the messages say it
	interpreter string
	script      []string // path below the repository's root
	source      string   // the metadata "source" its staged jobs carry
}

// TestPythonAPI: abandoned requests of a Python API finished by the real
// completer through the Python verifier, staged jobs moved into River by
// the real enqueuer, forged and replayed signatures refused.
func TestPythonAPI(t *testing.T) {
	runOrdersAPI(t, lang{name: "Python", interpreter: clienttest.Python(t),
		script: []string{"clients", "python", "example", "orders_api.py"}, source: "python-example"})
}

// TestRubyAPI is TestPythonAPI with the Ruby API (WEBrick, ruby-pg and the
// Rack middleware of clients/ruby).
func TestRubyAPI(t *testing.T) {
	runOrdersAPI(t, lang{name: "Ruby", interpreter: clienttest.Ruby(t),
		script: []string{"clients", "ruby", "example", "orders_api.rb"}, source: "ruby-example"})
}

// runOrdersAPI is the test of one language's order API.
func runOrdersAPI(t *testing.T, l lang) {
	completer := testbin.Build(t, "github.com/idemd/idemd/cmd/completer")
	enqueuer := testbin.Build(t, "github.com/idemd/idemd/cmd/enqueuer")
	root := clienttest.Root(t)
	dir := t.TempDir()
	db := clienttest.NewAPIDatabase(t)
	admin, err := pgxpool.New(context.Background(), db.AdminURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(admin.Close)

	raw := []byte(randomHex(32))
	secretFile := filepath.Join(dir, "replay-secret")
	if err := os.WriteFile(secretFile, raw, 0o600); err != nil {
		t.Fatal(err)
	}
	secret, err := replayauth.NewSecret(raw)
	if err != nil {
		t.Fatal(err)
	}
	addr := freeAddr(t)
	s := &system{t: t, dir: dir, db: db, admin: admin, apiURL: "http://" + addr, lang: l, secret: secret, rawSecret: raw, secretFil: secretFile,
		apiArgs: []string{filepath.Join(append([]string{root}, l.script...)...),
			"--addr", addr, "--database-url", db.APIURL, "--replay-secret-file", secretFile,
			"--lock-timeout", lockTimeout, "--test-control"}}
	s.startAPI()

	// --- Served by the API alone: the protocol as a client sees it.
	run := randomHex(4)
	var keys []string
	key := func(kind string, i int) string {
		k := fmt.Sprintf("%s-%s-%02d", kind, run, i)
		keys = append(keys, k)
		return k
	}
	for i := range 4 {
		k := key("ok", i)
		r := s.order(i+1, k, "book", i+1, 10*time.Second)
		if r.status != http.StatusCreated {
			t.Fatalf("order %s: %d %s %v", k, r.status, r.body, r.err)
		}
		again := s.order(i+1, k, "book", i+1, 10*time.Second)
		if again.status != http.StatusCreated || again.body != r.body || !again.replayed {
			t.Fatalf("retry of %s: %d %q replayed=%v, want the stored 201 %q", k, again.status, again.body, again.replayed, r.body)
		}
		if other := s.order(i+1, k, "book", i+2, 10*time.Second); other.status != http.StatusUnprocessableEntity {
			t.Fatalf("same key, other params: %d %s, want 422", other.status, other.body)
		}
	}

	// Eight identical requests at once: one holds the key, the others get
	// 409 (in progress) or its stored 201; one order.
	race := key("race", 0)
	var (
		rmu      sync.Mutex
		statuses = map[int]int{}
		rwg      sync.WaitGroup
	)
	for range 8 {
		rwg.Add(1)
		go func() {
			defer rwg.Done()
			r := s.order(9, race, "mug", 1, 10*time.Second)
			rmu.Lock()
			statuses[r.status]++
			rmu.Unlock()
		}()
	}
	rwg.Wait()
	if statuses[http.StatusCreated] == 0 || statuses[http.StatusCreated]+statuses[http.StatusConflict] != 8 {
		t.Fatalf("eight identical requests: statuses %v, want 201s and 409s only, at least one 201", statuses)
	}
	if n := s.scalar(`SELECT count(*) FROM orders o JOIN idempotency_keys k ON k.id = o.key_id WHERE k.idempotency_key = $1`, race); n != 1 {
		t.Fatalf("eight identical requests made %d orders, want 1", n)
	}

	// --- Abandoned: clients that give up after a 500 at each recovery
	// point (the key is unlocked there).
	abandoned := map[string]int{} // key -> user
	for _, at := range []string{"started", "order_created"} {
		s.faults(fmt.Sprintf(`[{"at":%q,"action":"fail"}]`, at))
		for i := range 2 {
			k := key("fail-"+at, i)
			abandoned[k] = 10 + i
			if r := s.order(10+i, k, "pen", 3, 10*time.Second); r.status != http.StatusInternalServerError {
				t.Fatalf("order %s with a fault at %s: %d %s, want 500", k, at, r.status, r.body)
			}
		}
	}
	// Clients whose own timeout runs out while the API is stalled; the API
	// fails the request afterwards, to nobody.
	s.faults(`[{"at":"started","action":"hang","seconds":1.5}]`)
	var gaveUp []string
	for i := range 2 {
		k := key("timeout", i)
		abandoned[k] = 20 + i
		gaveUp = append(gaveUp, k)
		if r := s.order(20+i, k, "cup", 1, 300*time.Millisecond); r.err == nil {
			t.Fatalf("order %s: %d %s, want the client to give up", k, r.status, r.body)
		}
	}
	until(t, 20*time.Second, "the stalled requests to fail and unlock their keys", func() (bool, error) {
		n := s.scalar(`SELECT count(*) FROM idempotency_keys WHERE idempotency_key = ANY($1) AND locked_at IS NULL AND recovery_point = 'started'`, gaveUp)
		return n == int64(len(gaveUp)), nil
	})

	// --- Abandoned: the process is SIGKILLed while requests hold their
	// keys at order_created; the keys stay locked until the lock timeout.
	s.faults(`[{"at":"order_created","action":"hang","seconds":3600}]`)
	var killed []string
	var wg sync.WaitGroup
	for i := range 3 {
		k := key("killed", i)
		abandoned[k] = 30 + i
		killed = append(killed, k)
		wg.Add(1)
		go func() {
			defer wg.Done()
			s.order(30+i, k, "lamp", 2, time.Minute)
		}()
	}
	until(t, 20*time.Second, "the killed requests to hold their keys at order_created", func() (bool, error) {
		n := s.scalar(`SELECT count(*) FROM idempotency_keys WHERE idempotency_key = ANY($1) AND locked_at IS NOT NULL AND recovery_point = 'order_created'`, killed)
		return n == int64(len(killed)), nil
	})
	s.api.kill()
	wg.Wait()
	s.startAPI() // no faults: they lived in the killed process

	if n := s.scalar(`SELECT count(*) FROM idempotency_keys WHERE recovery_point <> 'finished'`); n != int64(len(abandoned)) {
		t.Fatalf("%d unfinished keys, want the %d abandoned ones", n, len(abandoned))
	}

	// --- The replay path, before the completer runs: forged and replayed
	// signatures are refused, by status and by the nonces recorded.
	target := keys[5] // fail-started-…-00, unfinished, unlocked
	user := int64(abandoned[target])
	var params string
	if err := admin.QueryRow(context.Background(), `SELECT request_params::text FROM idempotency_keys WHERE idempotency_key = $1`, target).Scan(&params); err != nil {
		t.Fatal(err)
	}
	req := replayauth.Request{Method: "POST", Path: "/orders", UserID: user, IdempotencyKey: target, Body: []byte(params)}
	good := s.rawSecret
	forger := []byte("an attacker's guess at the secret!")
	now := time.Now().Unix()

	nonce := "forged-" + randomHex(8)
	if r := s.replay(replaytest.SignAt(now, nonce, req, forger), target, params); r.status != http.StatusUnauthorized || r.body != unauthorized {
		t.Fatalf("forged signature: %d %s, want 401 %s", r.status, r.body, unauthorized)
	}
	if n := s.nonceRows(nonce); n != 0 {
		t.Fatalf("a forged signature recorded its nonce (%d rows)", n)
	}
	nonce = "tampered-" + randomHex(8)
	if r := s.replay(replaytest.SignAt(now, nonce, req, good), target, strings.Replace(params, "3", "4", 1)); r.status != http.StatusUnauthorized {
		t.Fatalf("tampered body: %d %s, want 401", r.status, r.body)
	}
	nonce = "expired-" + randomHex(8)
	if r := s.replay(replaytest.SignAt(now-int64(replayauth.DefaultSkew/time.Second)-60, nonce, req, good), target, params); r.status != http.StatusUnauthorized {
		t.Fatalf("expired signature: %d %s, want 401", r.status, r.body)
	}
	if n := s.nonceRows(nonce); n != 0 {
		t.Fatalf("an expired signature recorded its nonce (%d rows)", n)
	}
	// A valid signature naming another user: no unfinished key of theirs.
	mallory := req
	mallory.UserID = user + 1000
	nonce = "other-user-" + randomHex(8)
	if r := s.replay(replaytest.SignAt(now, nonce, mallory, good), target, params); r.status != http.StatusUnauthorized {
		t.Fatalf("another user's key: %d %s, want 401", r.status, r.body)
	}
	// A nonce a Go replica of the API accepted is refused by this one.
	goPool, err := pgxpool.New(context.Background(), db.APIURL)
	if err != nil {
		t.Fatal(err)
	}
	defer goPool.Close()
	goNonce := "go-" + randomHex(8)
	if fresh, err := idem.NewReplayNonces(goPool, idem.ReplayNoncesOptions{}).Use(context.Background(), goNonce, time.Unix(now, 0).Add(replayauth.DefaultSkew)); err != nil || !fresh {
		t.Fatalf("Go records %s: fresh %v, err %v", goNonce, fresh, err)
	}
	if r := s.replay(replaytest.SignAt(now, goNonce, req, good), target, params); r.status != http.StatusUnauthorized {
		t.Fatalf("nonce used on a Go replica: %d %s, want 401", r.status, r.body)
	}
	// The nonce table refuses the API's inserts: fail closed with 503.
	if _, err := admin.Exec(context.Background(), `REVOKE INSERT ON idemd_replay_nonces FROM `+dbtest.APIRole); err != nil {
		t.Fatal(err)
	}
	nonce = "store-down-" + randomHex(8)
	r := s.replay(replaytest.SignAt(now, nonce, req, good), target, params)
	if _, err := admin.Exec(context.Background(), `GRANT INSERT ON idemd_replay_nonces TO `+dbtest.APIRole); err != nil {
		t.Fatal(err)
	}
	if r.status != http.StatusServiceUnavailable || r.body != fmt.Sprintf(`{"error":%q}`, idem.MsgInternal) {
		t.Fatalf("nonce store refusing inserts: %d %s, want 503", r.status, r.body)
	}
	// Valid: the key is finished through the replay path...
	nonce = "valid-" + randomHex(8)
	valid := replaytest.SignAt(now, nonce, req, good)
	if r := s.replay(valid, target, params); r.status != http.StatusCreated {
		t.Fatalf("valid replay: %d %s, want 201", r.status, r.body)
	}
	if n := s.nonceRows(nonce); n != 1 {
		t.Fatalf("the accepted nonce has %d rows, want 1", n)
	}
	// ... and the same signature again is refused.
	if r := s.replay(valid, target, params); r.status != http.StatusUnauthorized || r.body != unauthorized {
		t.Fatalf("replayed signature: %d %s, want 401", r.status, r.body)
	}
	// So is a fresh one for the key now finished.
	if r := s.replay(replaytest.SignAt(now, "finished-"+randomHex(8), req, good), target, params); r.status != http.StatusUnauthorized {
		t.Fatalf("finished key: %d %s, want 401", r.status, r.body)
	}
	delete(abandoned, target)
	completerNonces := func() int64 {
		return s.scalar(`SELECT count(*) FROM idemd_replay_nonces WHERE nonce ~ '^[0-9a-f]{32}$'`)
	}
	if n := completerNonces(); n != 0 {
		t.Fatalf("%d completer-like nonces before the completer ran", n)
	}

	// --- The daemons, as deployed: they finish every abandoned key
	// through the API's verifier and move every staged job into River.
	common := []string{"--database-url", db.URL, "--log-format", "console", "--http-addr=", "--shutdown-timeout", "10s"}
	enq := start(t, dir, "enqueuer", enqueuer, append(common, "--allowed-kinds", "send_order_receipt", "--sweep-interval", "1s")...)
	comp := start(t, dir, "completer", completer, append(common, "--api-url", s.apiURL, "--auth-secret-file", secretFile,
		"--grace", "1s", "--idle", "1s", "--lock-timeout", lockTimeout+"s", "--lease", "10s", "--request-timeout", "5s",
		"--backoff-base", "300ms", "--backoff-max", "2s", "--in-progress-delay", "500ms", "--poll-interval", "300ms",
		"--rate", "50", "--burst", "10", "--breaker-cooldown", "200ms", "--breaker-max-cooldown", "1s")...)

	total := int64(len(keys))
	until(t, 2*time.Minute, "every key finished and every job in River", func() (bool, error) {
		if !comp.running() || !enq.running() {
			t.Fatalf("a daemon exited: completer %v, enqueuer %v", comp.err, enq.err)
		}
		unfinished := s.scalar(`SELECT count(*) FROM idempotency_keys WHERE recovery_point <> 'finished'`)
		staged := s.scalar(`SELECT count(*) FROM staged_jobs`)
		jobs := s.scalar(`SELECT count(*) FROM river_job WHERE kind = 'send_order_receipt'`)
		return unfinished == 0 && staged == 0 && jobs == total, nil
	})
	if code := comp.stop(t, 30*time.Second); code != 0 {
		t.Errorf("completer exited %d after SIGTERM, want 0", code)
	}
	if code := enq.stop(t, 30*time.Second); code != 0 {
		t.Errorf("enqueuer exited %d after SIGTERM, want 0", code)
	}

	// --- Oracles, in SQL.
	ctx := context.Background()
	if n := s.scalar(`SELECT count(*) FROM orders`); n != total {
		t.Errorf("%d orders for %d keys", n, total)
	}
	if n := s.scalar(`SELECT count(*) FROM idempotency_keys k JOIN orders o ON o.key_id = k.id AND o.user_id = k.user_id
		WHERE k.response_code = 201 AND k.response_body::jsonb ->> 'order_id' = o.id::text`); n != total {
		t.Errorf("%d keys finished with a 201 naming their own order, want %d", n, total)
	}
	if n := s.scalar(`SELECT count(DISTINCT (args ->> 'order_id')) FROM river_job
		WHERE kind = 'send_order_receipt' AND (args ->> 'order_id')::bigint IN (SELECT id FROM orders)`); n != total {
		t.Errorf("%d distinct orders among the River jobs, want %d", n, total)
	}
	if n := s.scalar(`SELECT count(*) FROM river_job WHERE kind = 'send_order_receipt'
		AND queue = 'receipts' AND priority = 2 AND max_attempts = 5 AND tags::text[] = ARRAY['orders']
		AND metadata ->> 'source' = $1`, l.source); n != total {
		t.Errorf("%d River jobs carry the staged queue, priority, max_attempts, tags and metadata, want %d", n, total)
	}
	if n := s.scalar(`SELECT count(*) FROM staged_jobs_dead`); n != 0 {
		t.Errorf("%d dead-lettered staged jobs", n)
	}
	// Each abandoned key was replayed through the API's verifier, which
	// recorded the completer's nonce.
	if n := completerNonces(); n < int64(len(abandoned)) {
		t.Errorf("%d completer nonces recorded by the %s verifier, want at least %d", n, l.name, len(abandoned))
	}
	var rows pgx.Rows
	rows, err = admin.Query(ctx, `SELECT idempotency_key FROM idempotency_keys WHERE completer_gave_up_at IS NOT NULL`)
	if err == nil {
		gaveUpKeys, _ := pgx.CollectRows(rows, pgx.RowTo[string])
		if len(gaveUpKeys) > 0 {
			t.Errorf("the completer gave up on %v", gaveUpKeys)
		}
	}
	b, err := os.ReadFile(s.api.log)
	if err != nil {
		t.Fatal(err)
	}
	if n := bytes.Count(b, []byte("replay accepted")); n < len(abandoned) {
		t.Errorf("the restarted API logged %d accepted replays, want at least %d", n, len(abandoned))
	}
	var summary []string
	for k := range abandoned {
		summary = append(summary, k)
	}
	t.Logf("%d keys, %d abandoned and finished by the completer: %s", total, len(abandoned), strings.Join(summary, " "))
}
