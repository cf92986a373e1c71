package conformance

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/idemd/idemd/idem/replayauth"
	"github.com/idemd/idemd/internal/completer"
)

// answer is what the API sent back.
type answer struct {
	status   int
	body     string
	replayed bool // Idempotent-Replayed: true
}

func (a answer) String() string { return fmt.Sprintf("%d %s", a.status, clip(a.body)) }

func (a answer) ok() bool { return a.status >= 200 && a.status < 300 }

// keyMode is what a request says about its key.
type keyMode int

const (
	withKey keyMode = iota
	noKeyHeader
)

// req is one request to send.
type req struct {
	key       string
	mode      keyMode
	body      []byte // JSON object; encoded per the template
	headers   map[string]string
	signature string // Idemd-Replay-Signature; then only it authenticates
	rawBody   []byte // sent as is (signed replays), with rawType
	rawType   string
}

// encode turns a JSON object into the body the API takes.
func (r *run) encode(obj []byte) ([]byte, string, error) {
	return completer.EncodeBody(completer.Encoding(r.cfg.Template.Encoding), obj)
}

// send sends q and reads the whole answer.
func (r *run) send(ctx context.Context, q req) (answer, error) {
	body, ctype := q.rawBody, q.rawType
	if body == nil {
		b := q.body
		if b == nil {
			b = r.cfg.Template.Body
		}
		var err error
		if body, ctype, err = r.encode(b); err != nil {
			return answer{}, fmt.Errorf("encode body: %w", err)
		}
	}
	rctx, cancel := context.WithTimeout(ctx, r.cfg.RequestTimeout)
	defer cancel()
	hr, err := http.NewRequestWithContext(rctx, r.cfg.Template.Method, r.cfg.APIURL+r.cfg.Template.Path, strings.NewReader(string(body)))
	if err != nil {
		return answer{}, fmt.Errorf("build request: %w", err)
	}
	hr.Header.Set("Content-Type", ctype)
	hr.Header.Set("User-Agent", "idemctl-conformance")
	if q.signature != "" {
		// As the completer sends it: no credentials of the user's.
		hr.Header.Set(replayauth.Header, q.signature)
	} else {
		headers := q.headers
		if headers == nil {
			headers = r.cfg.Template.Headers
		}
		for k, v := range headers {
			hr.Header.Set(k, v)
		}
	}
	if q.mode == withKey {
		// Set directly: an empty value must be sent as one.
		hr.Header[replayauth.IdempotencyKeyHeader] = []string{q.key}
	}
	resp, err := r.cfg.HTTPClient.Do(hr)
	if err != nil {
		return answer{}, fmt.Errorf("%s %s: %w", r.cfg.Template.Method, r.cfg.Template.Path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return answer{}, fmt.Errorf("read the answer: %w", err)
	}
	return answer{status: resp.StatusCode, body: string(b), replayed: resp.Header.Get("Idempotent-Replayed") == "true"}, nil
}

// clip shortens a body for a message.
func clip(s string) string {
	s = strings.TrimSpace(s)
	if len(s) > 160 {
		return s[:160] + "..."
	}
	return s
}
