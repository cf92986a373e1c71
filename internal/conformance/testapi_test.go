package conformance_test

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemd/idemd/idem"
	"github.com/idemd/idemd/idem/replayauth"
)

// breaks are the switches of orderAPI: each breaks one rule of the
// protocol the way an API really gets it wrong.
type breaks struct {
	IgnoreKey       bool // no idempotency at all: every request runs
	ReplayOtherBody bool // a replay answers something else than the stored body
	RunTwice        bool // a key another request holds runs anyway
	AcceptNoKey     bool // a missing, empty or over-long key gets a random one
	MismatchRuns    bool // other parameters with a used key run as a new order
	// MismatchStatus is not a break but a dialect: the status other
	// parameters with a used key are refused with (0: idem's 422).
	MismatchStatus    int
	KeysGlobal        bool // keys are not scoped per user
	StageEveryRequest bool // the job is staged after the protocol, on replays too
	LeaveLocked       bool // a finished key is left locked
	NoResume          bool // an unfinished key is treated as in progress forever
	NoTakeover        bool // a crashed request's lock is never taken over
	NoHMAC            bool // replay signatures' HMAC not checked
	HMACOverStored    bool // the HMAC is checked over the stored params, not the received body
	NoWindow          bool // a signature's timestamp not checked
	NoUserCheck       bool // the signed user need not own the key
	NoNonce           bool // a signature may be used again
}

// customReplay reports whether the replay path is the test's own
// verifier (with one check left out) instead of idem's ReplayAuth.
func (b breaks) customReplay() bool {
	return b.NoHMAC || b.HMACOverStored || b.NoWindow || b.NoUserCheck || b.NoNonce
}

const ordersTable = `CREATE TABLE IF NOT EXISTS conformance_orders (
	id       BIGSERIAL PRIMARY KEY,
	user_id  BIGINT NOT NULL,
	key_id   BIGINT,
	sku      TEXT NOT NULL,
	quantity INT NOT NULL)`

// orderAPI is a small order API on idem: POST /orders {"sku", "quantity"}
// with "Authorization: Bearer user-<id>", one phase that inserts the
// order, stages a job and answers 201.
type orderAPI struct {
	pool   *pgxpool.Pool
	store  *idem.Store
	b      breaks
	secret []byte
	nonces sync.Map
}

type ctxUser struct{}

func newOrderAPI(pool *pgxpool.Pool, secret []byte, b breaks) (http.Handler, error) {
	opts := idem.Options{}
	if b.NoTakeover {
		opts.LockTimeout = 48 * time.Hour
	}
	a := &orderAPI{pool: pool, store: idem.New(pool, opts), b: b, secret: secret}
	if b.customReplay() {
		return a.replayAuth(a), nil
	}
	s, err := replayauth.NewSecret(secret)
	if err != nil {
		return nil, err
	}
	v, err := replayauth.NewVerifier(0, s)
	if err != nil {
		return nil, err
	}
	return a.store.ReplayAuth(v)(a), nil
}

type orderParams struct {
	Quantity int64  `json:"quantity"`
	SKU      string `json:"sku"`
}

func (a *orderAPI) user(r *http.Request) (int64, bool) {
	if id, ok := idem.ReplayUserID(r.Context()); ok {
		return id, true
	}
	if id, ok := r.Context().Value(ctxUser{}).(int64); ok {
		return id, true
	}
	id, err := strconv.ParseInt(strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer user-"), 10, 64)
	return id, err == nil && strings.HasPrefix(r.Header.Get("Authorization"), "Bearer user-")
}

func (a *orderAPI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost || r.URL.Path != "/orders" {
		http.NotFound(w, r)
		return
	}
	uid, ok := a.user(r)
	if !ok {
		idem.WriteJSONError(w, http.StatusUnauthorized, "Authentication required.")
		return
	}
	var p orderParams
	if err := json.NewDecoder(r.Body).Decode(&p); err != nil || p.SKU == "" || p.Quantity < 1 {
		idem.WriteJSONError(w, http.StatusUnprocessableEntity, "sku and quantity are required")
		return
	}
	ctx := r.Context()
	if a.b.IgnoreKey {
		id, err := a.insertOrder(ctx, a.pool, uid, nil, p)
		if err == nil {
			_, err = a.pool.Exec(ctx, `INSERT INTO staged_jobs (job_name, job_args) VALUES ('send_order_receipt', '{}')`)
		}
		if err != nil {
			idem.WriteJSONError(w, http.StatusInternalServerError, err.Error())
			return
		}
		writeRaw(w, http.StatusCreated, orderBody(id, p))
		return
	}
	key := r.Header.Get("Idempotency-Key")
	if a.b.AcceptNoKey && (key == "" || len(key) > 255) {
		key = "generated-" + uuid.NewString()
	}
	if err := idem.ValidateKey(key); err != nil {
		a.store.WriteError(w, err)
		return
	}
	keyUser := uid
	if a.b.KeysGlobal {
		keyUser = 1
	}
	if a.b.NoResume {
		var unfinished bool
		err := a.pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM idempotency_keys WHERE user_id = $1 AND idempotency_key = $2 AND recovery_point <> 'finished')`,
			keyUser, key).Scan(&unfinished)
		if err != nil || unfinished {
			idem.WriteJSONError(w, http.StatusConflict, idem.MsgInProgress)
			return
		}
	}
	out, err := a.store.Execute(ctx, idem.Request{UserID: keyUser, Key: key, Method: r.Method, Path: r.URL.Path, Params: p},
		idem.Phases{idem.RecoveryPointStarted: func(ctx context.Context, tx pgx.Tx, k *idem.Key) (idem.Result, error) {
			id, err := a.insertOrder(ctx, tx, uid, &k.ID, p)
			if err != nil {
				return nil, err
			}
			if !a.b.StageEveryRequest {
				if _, err := idem.StageJob(ctx, tx, "send_order_receipt", map[string]int64{"order_id": id}, nil); err != nil {
					return nil, err
				}
			}
			return idem.Response(http.StatusCreated, orderBody(id, p)), nil
		}})
	switch {
	case err != nil && a.b.RunTwice && errors.Is(err, idem.ErrInProgress):
		id, err := a.insertOrder(ctx, a.pool, uid, nil, p)
		if err != nil {
			idem.WriteJSONError(w, http.StatusInternalServerError, err.Error())
			return
		}
		writeRaw(w, http.StatusCreated, orderBody(id, p))
		return
	case err != nil && a.b.MismatchStatus != 0 && errors.Is(err, idem.ErrParamsMismatch):
		idem.WriteJSONError(w, a.b.MismatchStatus, idem.MsgParamsMismatch)
		return
	case err != nil && a.b.MismatchRuns && errors.Is(err, idem.ErrParamsMismatch):
		id, err := a.insertOrder(ctx, a.pool, uid, nil, p)
		if err != nil {
			idem.WriteJSONError(w, http.StatusInternalServerError, err.Error())
			return
		}
		writeRaw(w, http.StatusCreated, orderBody(id, p))
		return
	case err != nil:
		a.store.WriteError(w, err)
		return
	}
	if a.b.StageEveryRequest {
		if _, err := a.pool.Exec(ctx, `INSERT INTO staged_jobs (job_name, job_args) VALUES ('send_order_receipt', '{}')`); err != nil {
			idem.WriteJSONError(w, http.StatusInternalServerError, err.Error())
			return
		}
	}
	if a.b.LeaveLocked && !out.Replayed {
		if _, err := a.pool.Exec(ctx, `UPDATE idempotency_keys SET locked_at = now() WHERE id = $1`, out.Key.ID); err != nil {
			idem.WriteJSONError(w, http.StatusInternalServerError, err.Error())
			return
		}
	}
	if a.b.ReplayOtherBody && out.Replayed {
		w.Header().Set(idem.ReplayedHeader, "true")
		writeRaw(w, out.Status, []byte(strings.Replace(string(out.Body), "{", `{"replayed":true,`, 1)))
		return
	}
	idem.WriteOutcome(w, out)
}

type execer interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

func (a *orderAPI) insertOrder(ctx context.Context, q execer, uid int64, keyID *int64, p orderParams) (int64, error) {
	var id int64
	err := q.QueryRow(ctx, `INSERT INTO conformance_orders (user_id, key_id, sku, quantity) VALUES ($1, $2, $3, $4) RETURNING id`,
		uid, keyID, p.SKU, p.Quantity).Scan(&id)
	return id, err
}

func orderBody(id int64, p orderParams) []byte {
	return []byte(fmt.Sprintf(`{"order_id":%d,"sku":%q,"quantity":%d}`, id, p.SKU, p.Quantity))
}

func writeRaw(w http.ResponseWriter, status int, body []byte) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

// replayAuth is a replay verifier written by hand, as an API in another
// language has one, with the check its breaks name left out.
func (a *orderAPI) replayAuth(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := r.Header.Get(replayauth.Header)
		if h == "" {
			next.ServeHTTP(w, r)
			return
		}
		body, _ := io.ReadAll(r.Body)
		uid, err := a.verify(r, h, body)
		if err != nil {
			idem.WriteJSONError(w, http.StatusUnauthorized, "Replay signature rejected.")
			return
		}
		r.Body = io.NopCloser(strings.NewReader(string(body)))
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), ctxUser{}, uid)))
	})
}

func (a *orderAPI) verify(r *http.Request, h string, body []byte) (int64, error) {
	var ts, uid int64
	var nonce string
	var sigs []string
	for _, f := range strings.Split(h, ",") {
		k, v, _ := strings.Cut(f, "=")
		switch k {
		case "t":
			ts, _ = strconv.ParseInt(v, 10, 64)
		case "n":
			nonce = v
		case "u":
			uid, _ = strconv.ParseInt(v, 10, 64)
		case "v1":
			sigs = append(sigs, v)
		}
	}
	key := r.Header.Get("Idempotency-Key")
	ctx := r.Context()
	var stored []byte
	q := `SELECT request_params::text FROM idempotency_keys WHERE idempotency_key = $1 AND user_id = $2
		AND recovery_point <> 'finished' AND request_method = $3 AND request_path = $4`
	args := []any{key, uid, r.Method, r.URL.Path}
	if a.b.NoUserCheck {
		q = `SELECT request_params::text FROM idempotency_keys WHERE idempotency_key = $1 AND $2::bigint IS NOT NULL
			AND recovery_point <> 'finished' AND request_method = $3 AND request_path = $4 LIMIT 1`
	}
	if err := a.pool.QueryRow(ctx, q, args...).Scan(&stored); err != nil {
		return 0, fmt.Errorf("no unfinished key: %w", err)
	}
	if !a.b.NoHMAC {
		signed := body
		if a.b.HMACOverStored {
			signed = stored
		}
		m := hmac.New(sha256.New, a.secret)
		m.Write([]byte(replayauth.Canonical(ts, nonce, replayauth.Request{Method: r.Method, Path: r.URL.Path, UserID: uid, IdempotencyKey: key, Body: signed})))
		want := hex.EncodeToString(m.Sum(nil))
		ok := false
		for _, s := range sigs {
			ok = ok || hmac.Equal([]byte(s), []byte(want))
		}
		if !ok {
			return 0, errors.New("bad signature")
		}
	}
	if !a.b.NoWindow {
		if d := time.Since(time.Unix(ts, 0)); d > replayauth.DefaultSkew || d < -replayauth.DefaultSkew {
			return 0, errors.New("expired")
		}
	}
	if !a.b.NoNonce {
		if _, seen := a.nonces.LoadOrStore(nonce, true); seen {
			return 0, errors.New("nonce used")
		}
	}
	return uid, nil
}
