// Package fakestripe is a small stateful stand-in for Stripe's charges API,
// enough for Rocket Rides and its tests: it honours Stripe's Idempotency-Key
// semantics and records every charge it creates, so a test can check what
// actually reached "Stripe" (the oracle), not what the API believes.
//
// Idempotency, as Stripe documents it:
//   - the same key with the same parameters returns the stored response
//     (status and body) without creating anything, with header
//     Idempotent-Replayed: true;
//   - the same key with different parameters is a 400 idempotency_error;
//   - keys are scoped to the API key and forgotten after 24 hours (on the
//     server's clock, injectable with SetClock);
//   - a request rejected before the endpoint runs (missing API key, an
//     outage) stores nothing.
//
// Customers whose id starts with DeclinePrefix, or were passed to
// DeclineCustomer, get a card_declined 402 (stored, like Stripe's).
package fakestripe

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"
)

// DeclinePrefix marks customers whose card is always declined.
const DeclinePrefix = "cus_decline"

// KeyRetention is how long an idempotency key is remembered.
const KeyRetention = 24 * time.Hour

// Charge is one charge object the fake created.
type Charge struct {
	ID             string            `json:"id"`
	Amount         int64             `json:"amount"`
	Currency       string            `json:"currency"`
	Customer       string            `json:"customer"`
	Description    string            `json:"description"`
	Metadata       map[string]string `json:"metadata,omitempty"`
	Status         string            `json:"status"` // succeeded or failed (declined)
	IdempotencyKey string            `json:"idempotency_key,omitempty"`
	Created        time.Time         `json:"created"`
}

type stored struct {
	fingerprint string
	status      int
	body        []byte
	at          time.Time
}

// Server is the fake. The zero value is not usable; call New.
type Server struct {
	mu       sync.Mutex
	now      func() time.Time
	charges  []Charge
	keys     map[string]stored
	declined map[string]bool
	outage   bool
	latency  time.Duration
	requests int
	replays  int
}

// New returns an empty fake Stripe.
func New() *Server {
	return &Server{now: time.Now, keys: map[string]stored{}, declined: map[string]bool{}}
}

// SetClock replaces the clock used for key expiry.
func (s *Server) SetClock(now func() time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.now = now
}

// SetOutage makes every request fail with 503 api_error (nothing stored)
// until switched off.
func (s *Server) SetOutage(on bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.outage = on
}

// DeclineCustomer makes charges to customer fail with card_declined.
func (s *Server) DeclineCustomer(customer string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.declined[customer] = true
}

// SetLatency delays each charge creation by d (the simulator uses it so
// that clients can give up mid-request). Zero in tests.
func (s *Server) SetLatency(d time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.latency = d
}

// Charges returns every charge created, in order, declined ones included
// (Stripe creates a failed charge for a decline).
func (s *Server) Charges() []Charge {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]Charge, len(s.charges))
	copy(out, s.charges)
	return out
}

// ChargeCount is len(Charges()).
func (s *Server) ChargeCount() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.charges)
}

// Stats counts requests received and responses served from stored keys.
type Stats struct {
	Requests  int `json:"requests"`
	Replays   int `json:"replays"`
	Charges   int `json:"charges"`
	Succeeded int `json:"succeeded"`
	Failed    int `json:"failed"`
}

// Stats returns the counters.
func (s *Server) Stats() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := Stats{Requests: s.requests, Replays: s.replays, Charges: len(s.charges)}
	for _, c := range s.charges {
		if c.Status == "succeeded" {
			st.Succeeded++
		} else {
			st.Failed++
		}
	}
	return st
}

// ServeHTTP serves POST /v1/charges, and GET /_fake/charges and
// GET /_fake/stats for humans and scripts.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch {
	case r.Method == http.MethodPost && r.URL.Path == "/v1/charges":
		s.createCharge(w, r)
	case r.Method == http.MethodGet && r.URL.Path == "/_fake/charges":
		writeJSON(w, http.StatusOK, s.Charges())
	case r.Method == http.MethodGet && r.URL.Path == "/_fake/stats":
		writeJSON(w, http.StatusOK, s.Stats())
	default:
		writeError(w, http.StatusNotFound, "invalid_request_error", "resource_missing", "Unrecognized request URL.")
	}
}

func (s *Server) createCharge(w http.ResponseWriter, r *http.Request) {
	apiKey := strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")
	if apiKey == "" || apiKey == r.Header.Get("Authorization") {
		writeError(w, http.StatusUnauthorized, "invalid_request_error", "", "You did not provide an API key.")
		return
	}
	if err := r.ParseForm(); err != nil {
		writeError(w, http.StatusBadRequest, "invalid_request_error", "parameter_invalid", "Could not parse the form body.")
		return
	}
	s.mu.Lock()
	s.requests++
	outage, latency := s.outage, s.latency
	s.mu.Unlock()
	if outage {
		writeError(w, http.StatusServiceUnavailable, "api_error", "", "Stripe is temporarily unavailable (fake outage).")
		return
	}
	if latency > 0 {
		t := time.NewTimer(latency)
		select {
		case <-t.C:
		case <-r.Context().Done():
			t.Stop()
			// Like a real server, the work goes on after the client left.
		}
	}

	idemKey := r.Header.Get("Idempotency-Key")
	// url.Values.Encode sorts by name: a canonical form of the parameters.
	fp := r.URL.Path + "?" + r.PostForm.Encode()
	scope := apiKey + "\x00" + idemKey

	// The whole create runs under the lock, so concurrent requests with one
	// key are serialised: the second sees the first's stored response.
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	if idemKey != "" {
		if st, ok := s.keys[scope]; ok {
			if now.Sub(st.at) < KeyRetention {
				if st.fingerprint != fp {
					writeError(w, http.StatusBadRequest, "idempotency_error", "",
						"Keys for idempotent requests can only be used with the same parameters they were first used with. Try using a key other than '"+idemKey+"' if you meant to execute a different request.")
					return
				}
				s.replays++
				w.Header().Set("Idempotent-Replayed", "true")
				writeRaw(w, st.status, st.body)
				return
			}
			delete(s.keys, scope)
		}
	}
	status, body := s.create(r, idemKey, now)
	if idemKey != "" {
		s.keys[scope] = stored{fingerprint: fp, status: status, body: body, at: now}
	}
	writeRaw(w, status, body)
}

// create validates and records a charge; s.mu is held.
func (s *Server) create(r *http.Request, idemKey string, now time.Time) (int, []byte) {
	f := r.PostForm
	amount, err := strconv.ParseInt(f.Get("amount"), 10, 64)
	if err != nil || amount <= 0 {
		return errorBody(http.StatusBadRequest, "invalid_request_error", "parameter_invalid_integer", "Invalid positive integer: amount")
	}
	currency := f.Get("currency")
	if currency == "" {
		return errorBody(http.StatusBadRequest, "invalid_request_error", "parameter_missing", "Missing required param: currency.")
	}
	customer := f.Get("customer")
	if customer == "" {
		return errorBody(http.StatusBadRequest, "invalid_request_error", "parameter_missing", "Must provide source or customer.")
	}
	c := Charge{
		ID: "ch_" + randomID(), Amount: amount, Currency: currency, Customer: customer,
		Description: f.Get("description"), IdempotencyKey: idemKey, Created: now, Status: "succeeded",
	}
	for k, v := range f {
		if name, ok := strings.CutPrefix(k, "metadata["); ok && strings.HasSuffix(name, "]") && len(v) > 0 {
			if c.Metadata == nil {
				c.Metadata = map[string]string{}
			}
			c.Metadata[strings.TrimSuffix(name, "]")] = v[0]
		}
	}
	if s.declined[customer] || strings.HasPrefix(customer, DeclinePrefix) {
		c.Status = "failed"
		s.charges = append(s.charges, c)
		b, _ := json.Marshal(map[string]any{"error": map[string]any{
			"type": "card_error", "code": "card_declined", "decline_code": "generic_decline",
			"message": "Your card was declined.", "charge": c.ID,
		}})
		return http.StatusPaymentRequired, b
	}
	s.charges = append(s.charges, c)
	b, _ := json.Marshal(map[string]any{
		"id": c.ID, "object": "charge", "amount": c.Amount, "currency": c.Currency,
		"customer": c.Customer, "description": c.Description, "metadata": c.Metadata,
		"status": c.Status, "paid": true, "captured": true, "created": now.Unix(), "livemode": false,
	})
	return http.StatusOK, b
}

func randomID() string {
	b := make([]byte, 12)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func errorBody(status int, typ, code, msg string) (int, []byte) {
	e := map[string]any{"type": typ, "message": msg}
	if code != "" {
		e["code"] = code
	}
	b, _ := json.Marshal(map[string]any{"error": e})
	return status, b
}

func writeError(w http.ResponseWriter, status int, typ, code, msg string) {
	st, b := errorBody(status, typ, code, msg)
	writeRaw(w, st, b)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, _ := json.Marshal(v)
	writeRaw(w, status, b)
}

func writeRaw(w http.ResponseWriter, status int, b []byte) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Request-Id", "req_"+randomID())
	w.WriteHeader(status)
	_, _ = w.Write(b)
}
