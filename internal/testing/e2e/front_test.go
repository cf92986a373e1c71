//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemd/idemd/idem/replayauth"
	"github.com/idemd/idemd/internal/testing/replaytest"
)

// Modes of the replay front, which the suite switches between faults.
const (
	modeNormal  = "normal"
	modeSkewed  = "skewed"  // re-signed with the clock 10 minutes ahead
	modeSlow    = "slow"    // held past the completer's request timeout
	modeRecover = "recover" // after the skew was fixed
)

// replayFront sits between the completers and the API. It sees every signed
// replay, so it can (a) check that no two replays of one key are ever in
// flight at once (invariant 2), (b) re-sign replays as a signer whose clock
// is skewed would (the completer has no clock flag, and the harness holds
// the secret), and (c) hold replays past the completer's timeout while the
// API still does the work, as a slow network or an overloaded API would.
type replayFront struct {
	target string
	signer *replayauth.Signer
	secret []byte // signer's, for the headers replayauth will not sign
	client *http.Client
	mode   atomic.Value // string
	// slowFor is how long a replay is held in modeSlow.
	slowFor time.Duration

	mu       sync.Mutex
	inFlight map[string]bool
	overlaps []string
	statuses map[string]map[int]int // mode -> status -> count
	errors   map[string]int
	wg       sync.WaitGroup
}

func newReplayFront(target string, secret []byte, slowFor time.Duration) (*replayFront, error) {
	s, err := replayauth.NewSecret(secret)
	if err != nil {
		return nil, fmt.Errorf("front secret: %w", err)
	}
	signer, err := replayauth.NewSigner(s)
	if err != nil {
		return nil, fmt.Errorf("front signer: %w", err)
	}
	f := &replayFront{
		target: strings.TrimRight(target, "/"), signer: signer, secret: secret, slowFor: slowFor,
		client:   &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 16}},
		inFlight: map[string]bool{}, statuses: map[string]map[int]int{}, errors: map[string]int{},
	}
	f.mode.Store(modeNormal)
	return f, nil
}

func (f *replayFront) setMode(m string) { f.mode.Store(m) }

func (f *replayFront) count(mode string, status int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.statuses[mode] == nil {
		f.statuses[mode] = map[int]int{}
	}
	f.statuses[mode][status]++
}

// statusCount returns how many replays sent in mode got a status matching ok.
func (f *replayFront) statusCount(mode string, ok func(int) bool) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for st, c := range f.statuses[mode] {
		if ok(st) {
			n += c
		}
	}
	return n
}

func (f *replayFront) summary() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return fmt.Sprintf("statuses by mode %v, transport errors %v, overlaps %d", f.statuses, f.errors, len(f.overlaps))
}

func (f *replayFront) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.wg.Add(1)
	defer f.wg.Done()
	mode := f.mode.Load().(string)
	body, err := io.ReadAll(r.Body)
	if err != nil {
		http.Error(w, "front: read body", http.StatusBadGateway)
		return
	}
	sig := r.Header.Get(replayauth.Header)
	key := r.Header.Get(replayauth.IdempotencyKeyHeader)
	parsed, perr := replaytest.Parse(sig)
	slot := fmt.Sprintf("%d/%s", parsed.UserID, key)

	ctx := r.Context()
	switch mode {
	case modeSkewed:
		if perr == nil {
			// The same request signed ten minutes in the future: what a
			// completer whose clock runs ahead sends.
			sig = replaytest.SignAt(parsed.Timestamp+int64((10*time.Minute)/time.Second), parsed.Nonce, replayauth.Request{
				Method: r.Method, Path: r.URL.Path, UserID: parsed.UserID, IdempotencyKey: key, Body: body,
			}, f.secret)
		}
	case modeSlow:
		// The completer gives up after its request timeout; the API still
		// receives the request and does the work, as it would behind a slow
		// network. Its replay is not tracked for overlaps: a retry after a
		// client timeout may legitimately meet it, and the API's key lock
		// answers that with a 409.
		t := time.NewTimer(f.slowFor)
		<-t.C // injected latency, not a wait for work
		ctx = context.WithoutCancel(ctx)
	}
	if mode != modeSlow {
		f.mu.Lock()
		if f.inFlight[slot] {
			f.overlaps = append(f.overlaps, fmt.Sprintf("%s at %s", slot, time.Now().Format("15:04:05.000")))
		}
		f.inFlight[slot] = true
		f.mu.Unlock()
		defer func() { f.mu.Lock(); delete(f.inFlight, slot); f.mu.Unlock() }()
	}

	req, err := http.NewRequestWithContext(ctx, r.Method, f.target+r.URL.RequestURI(), bytes.NewReader(body))
	if err != nil {
		http.Error(w, "front: "+err.Error(), http.StatusBadGateway)
		return
	}
	req.Header = r.Header.Clone()
	req.Header.Set(replayauth.Header, sig)
	resp, err := f.client.Do(req)
	if err != nil {
		f.mu.Lock()
		f.errors[mode]++
		f.mu.Unlock()
		http.Error(w, "front: "+err.Error(), http.StatusBadGateway)
		return
	}
	defer resp.Body.Close()
	f.count(mode, resp.StatusCode)
	for k, v := range resp.Header {
		w.Header()[k] = v
	}
	w.WriteHeader(resp.StatusCode)
	_, _ = io.Copy(w, resp.Body)
}

// overlapping returns the overlaps seen so far.
func (f *replayFront) overlapping() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.overlaps...)
}

// close waits for held replays and releases connections.
func (f *replayFront) close() {
	f.wg.Wait()
	f.client.CloseIdleConnections()
}
