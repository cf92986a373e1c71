package api

import (
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"sync"
	"sync/atomic"

	"github.com/jackc/pgx/v5/pgconn"
)

// FaultKind is what an injected fault does.
type FaultKind string

const (
	// FaultInternal fails the request with a 500 (the article's raise_error):
	// the current phase rolls back and the key is unlocked where it was.
	FaultInternal FaultKind = "internal"
	// FaultSerialization makes the phase fail with a serialization failure
	// (SQLSTATE 40001), as a concurrent transaction would: idem retries it
	// and, if it keeps failing, answers 409.
	FaultSerialization FaultKind = "serialization"
)

// AtBefore is the fault point before any work (no key is created).
const AtBefore = "before"

// FaultRule injects a fault into a fraction of requests at one point: before
// any work, or at the start of the phase that runs from a recovery point
// ("started", "ride_created", "charge_created"), i.e. right after that point
// was reached. An empty At matches every point.
type FaultRule struct {
	At   string    `json:"at"`
	Rate float64   `json:"rate"` // 0..1
	Kind FaultKind `json:"kind"` // default internal
}

// Faults is the runtime fault switch. It is process state, never stored on
// a key, so a replay of the same key may succeed where the first try failed.
// A nil *Faults injects nothing. It serves GET (rules) and PUT (replace
// rules, a JSON array) for operators and the demo.
type Faults struct {
	mu    sync.Mutex
	rules []FaultRule
	fired atomic.Int64
}

// NewFaults returns a switch with rules.
func NewFaults(rules ...FaultRule) *Faults {
	f := &Faults{}
	if err := f.Set(rules...); err != nil {
		panic(err)
	}
	return f
}

// Set replaces the rules.
func (f *Faults) Set(rules ...FaultRule) error {
	for _, r := range rules {
		if r.Rate < 0 || r.Rate > 1 {
			return fmt.Errorf("rocketrides: fault rate %v outside 0..1", r.Rate)
		}
		switch r.Kind {
		case "", FaultInternal, FaultSerialization:
		default:
			return fmt.Errorf("rocketrides: unknown fault kind %q", r.Kind)
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.rules = append([]FaultRule(nil), rules...)
	return nil
}

// Rules returns the current rules.
func (f *Faults) Rules() []FaultRule {
	if f == nil {
		return nil
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]FaultRule(nil), f.rules...)
}

// Fired counts faults injected so far.
func (f *Faults) Fired() int64 {
	if f == nil {
		return 0
	}
	return f.fired.Load()
}

// ErrInjected is the error of a FaultInternal.
var ErrInjected = errors.New("rocketrides: injected fault")

// check returns the fault to inject at point, if any.
func (f *Faults) check(point string) error {
	if f == nil {
		return nil
	}
	f.mu.Lock()
	rules := f.rules
	f.mu.Unlock()
	for _, r := range rules {
		if (r.At != "" && r.At != point) || r.Rate <= 0 {
			continue
		}
		if r.Rate < 1 && rand.Float64() >= r.Rate {
			continue
		}
		f.fired.Add(1)
		if r.Kind == FaultSerialization {
			return &pgconn.PgError{Code: "40001", Message: "injected serialization failure at " + point}
		}
		return fmt.Errorf("%w at %s", ErrInjected, point)
	}
	return nil
}

// ServeHTTP: GET returns the rules, PUT replaces them.
func (f *Faults) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch r.Method {
	case http.MethodGet:
	case http.MethodPut:
		var rules []FaultRule
		if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<16)).Decode(&rules); err != nil {
			http.Error(w, "body must be a JSON array of {at, rate, kind}", http.StatusBadRequest)
			return
		}
		if err := f.Set(rules...); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
	default:
		w.Header().Set("Allow", "GET, PUT")
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(map[string]any{"rules": f.Rules(), "fired": f.Fired()})
}
