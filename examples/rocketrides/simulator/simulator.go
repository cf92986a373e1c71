// Package simulator issues Rocket Rides traffic the way real clients behave,
// including the failures idemd exists for: clients that give up mid-request
// (their key is left unfinished, for the completer), and clients that retry
// with the same key after a 409 or 5xx.
package simulator

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"go.uber.org/zap"
)

// Config tunes a run. BaseURL and APIKeys are required.
type Config struct {
	BaseURL string
	// APIKeys of the riders to send as (Authorization: Bearer).
	APIKeys     []string
	Concurrency int           // parallel clients (default 4)
	Duration    time.Duration // stop starting new rides after this (default 20 s)
	// Rides caps the number of rides (0: until Duration).
	Rides int
	// GiveUpRate is the fraction of rides whose client abandons the request
	// after a random delay up to GiveUpAfter and never retries it.
	GiveUpRate  float64
	GiveUpAfter time.Duration // default 50 ms
	// MaxRetries after a 409 or 5xx, with the same key (default 2).
	MaxRetries int
	HTTPClient *http.Client
	Logger     *zap.Logger
}

// Stats counts what happened. Rides = Created + Declined + GaveUp +
// Abandoned + Rejected.
type Stats struct {
	Rides     int64 `json:"rides"`
	Requests  int64 `json:"requests"`
	Created   int64 `json:"created"`   // 201
	Declined  int64 `json:"declined"`  // 402, final
	GaveUp    int64 `json:"gave_up"`   // the client walked away mid-request
	Abandoned int64 `json:"abandoned"` // still failing after MaxRetries
	Rejected  int64 `json:"rejected"`  // other 4xx: a bug in the simulator or API
	Conflicts int64 `json:"conflicts"` // 409 responses seen (retried)
	Errors5xx int64 `json:"errors_5xx"`
}

func (s Stats) String() string {
	return fmt.Sprintf("rides=%d requests=%d created=%d declined=%d gave_up=%d abandoned=%d rejected=%d conflicts=%d 5xx=%d",
		s.Rides, s.Requests, s.Created, s.Declined, s.GaveUp, s.Abandoned, s.Rejected, s.Conflicts, s.Errors5xx)
}

type counters struct {
	rides, requests, created, declined, gaveUp, abandoned, rejected, conflicts, errors5xx atomic.Int64
}

// Run drives traffic until the duration or ride count is reached, or ctx
// ends, and returns the counts.
func Run(ctx context.Context, cfg Config) (Stats, error) {
	if cfg.BaseURL == "" || len(cfg.APIKeys) == 0 {
		return Stats{}, errors.New("simulator: BaseURL and APIKeys are required")
	}
	if cfg.Concurrency <= 0 {
		cfg.Concurrency = 4
	}
	if cfg.Duration <= 0 {
		cfg.Duration = 20 * time.Second
	}
	if cfg.GiveUpAfter <= 0 {
		cfg.GiveUpAfter = 50 * time.Millisecond
	}
	if cfg.MaxRetries == 0 {
		cfg.MaxRetries = 2
	}
	if cfg.HTTPClient == nil {
		cfg.HTTPClient = &http.Client{Timeout: 30 * time.Second}
	}
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	runCtx, cancel := context.WithTimeout(ctx, cfg.Duration)
	defer cancel()

	var (
		c      counters
		issued atomic.Int64
		wg     sync.WaitGroup
	)
	for range cfg.Concurrency {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for runCtx.Err() == nil {
				if cfg.Rides > 0 && issued.Add(1) > int64(cfg.Rides) {
					return
				}
				// A ride in flight finishes its retries on ctx (not
				// runCtx), so the duration does not itself abandon keys.
				ride(ctx, cfg, &c)
			}
		}()
	}
	wg.Wait()
	return Stats{
		Rides: c.rides.Load(), Requests: c.requests.Load(), Created: c.created.Load(), Declined: c.declined.Load(),
		GaveUp: c.gaveUp.Load(), Abandoned: c.abandoned.Load(), Rejected: c.rejected.Load(),
		Conflicts: c.conflicts.Load(), Errors5xx: c.errors5xx.Load(),
	}, ctx.Err()
}

// RandomParams returns a ride's form parameters (somewhere near San
// Francisco, with a few decimals, as a phone would send).
func RandomParams() url.Values {
	f := func(base float64) string { return strconv.FormatFloat(base+rand.Float64()-0.5, 'f', 6, 64) }
	return url.Values{
		"origin_lat": {f(37.77)}, "origin_lon": {f(-122.42)},
		"target_lat": {f(37.77)}, "target_lon": {f(-122.42)},
	}
}

func ride(ctx context.Context, cfg Config, c *counters) {
	c.rides.Add(1)
	key := uuid.NewString()
	apiKey := cfg.APIKeys[rand.IntN(len(cfg.APIKeys))]
	body := RandomParams().Encode()
	giveUp := rand.Float64() < cfg.GiveUpRate

	for attempt := 0; ; attempt++ {
		if ctx.Err() != nil {
			c.abandoned.Add(1)
			return
		}
		reqCtx, cancel := context.WithCancel(ctx)
		if giveUp {
			// Walk away somewhere in the middle of the request.
			d := time.Duration(rand.Int64N(int64(cfg.GiveUpAfter)) + 1)
			t := time.AfterFunc(d, cancel)
			defer t.Stop()
		}
		status, err := post(reqCtx, cfg, apiKey, key, body)
		cancel()
		c.requests.Add(1)
		switch {
		case giveUp && err != nil:
			c.gaveUp.Add(1)
			return
		case err == nil && status == http.StatusCreated:
			c.created.Add(1)
			return
		case err == nil && status == http.StatusPaymentRequired:
			c.declined.Add(1)
			return
		case err == nil && status == http.StatusConflict:
			c.conflicts.Add(1)
		case err == nil && status >= 500:
			c.errors5xx.Add(1)
		case err == nil:
			cfg.Logger.Warn("simulator: request rejected", zap.Int("status", status))
			c.rejected.Add(1)
			return
		}
		if attempt >= cfg.MaxRetries {
			// The client gives up for good: the key is the completer's.
			c.abandoned.Add(1)
			return
		}
		// Backoff with jitter before retrying the same key.
		select {
		case <-ctx.Done():
		case <-time.After(time.Duration(10*(attempt+1)+rand.IntN(20)) * time.Millisecond):
		}
	}
}

func post(ctx context.Context, cfg Config, apiKey, key, body string) (int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimRight(cfg.BaseURL, "/")+"/rides", strings.NewReader(body))
	if err != nil {
		return 0, err
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Authorization", "Bearer "+apiKey)
	req.Header.Set("Idempotency-Key", key)
	resp, err := cfg.HTTPClient.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode, nil
}
