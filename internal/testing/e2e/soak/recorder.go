package soak

import (
	"net/http"
	"slices"
	"sync"
	"time"
)

// recorder is the simulator's transport: it keeps the latency of every
// response its clients got since the last window, so each sample has the
// clients' p50 and p99 of its interval (the simulator itself only counts
// at the end of its run).
type recorder struct {
	next http.RoundTripper

	mu        sync.Mutex
	latencies []time.Duration
}

func (r *recorder) RoundTrip(req *http.Request) (*http.Response, error) {
	t0 := time.Now()
	resp, err := r.next.RoundTrip(req)
	if err == nil {
		d := time.Since(t0)
		r.mu.Lock()
		r.latencies = append(r.latencies, d)
		r.mu.Unlock()
	}
	return resp, err
}

// window returns the responses since the last call and their p50 and p99,
// and starts a new window.
func (r *recorder) window() (n int, p50, p99 time.Duration) {
	r.mu.Lock()
	l := r.latencies
	r.latencies = nil
	r.mu.Unlock()
	if len(l) == 0 {
		return 0, 0, 0
	}
	slices.Sort(l)
	at := func(p float64) time.Duration { return l[int(float64(len(l)-1)*p)] }
	return len(l), at(0.50), at(0.99)
}

// CloseIdleConnections closes the wrapped transport's idle connections
// (http.Client.CloseIdleConnections reaches them through this).
func (r *recorder) CloseIdleConnections() {
	if c, ok := r.next.(interface{ CloseIdleConnections() }); ok {
		c.CloseIdleConnections()
	}
}
