// Package idem implements Stripe-style idempotency keys with atomic phases
// and recovery points on PostgreSQL, against idemd's schema contract
// (migrations/): the API side of the protocol that idemd's daemons support.
//
// A request goes through:
//
//  1. Begin: claim the key (unique per user) with atomic statements. A new
//     key is inserted locked at recovery point "started" (INSERT ... ON
//     CONFLICT DO NOTHING: exactly one of racing requests creates it); an
//     existing one must carry the same request fingerprint (else
//     ErrParamsMismatch) and must not be locked by a live request (else
//     ErrInProgress), and is then locked by one conditional UPDATE. A
//     finished key is returned unlocked and its stored response is replayed
//     (byte for byte on idemd's schema; on the article's JSONB column, the
//     stored JSON's text: see Response).
//  2. Phases: each phase runs in its own transaction, READ COMMITTED by
//     default (Options.Isolation), which first locks the key row (SELECT ...
//     FOR UPDATE) and checks the request still holds the key at the
//     recovery point it expects, so phases of one key never overlap. A phase
//     returns a recovery point (the key moves on), a response (the key is
//     finished and the response stored), or nothing. Serialization failures
//     and deadlocks are retried a few times; any other failure unlocks the
//     key so a retry (by the client or idemd's completer) can continue from
//     the last committed phase.
//  3. StageJob: background work is inserted into staged_jobs inside a phase's
//     transaction, so it exists exactly when the phase committed; idemd's
//     enqueuer moves it into River.
//
// ReplayAuth is the middleware that lets idemd's completer replay an
// abandoned request on behalf of the key's user, through the HMAC signature
// of package replayauth, with the signatures' nonces recorded in
// PostgreSQL (ReplayNonces) so every API replica refuses a replayed one.
package idem

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Recovery points every flow has. An API defines its own in between.
const (
	RecoveryPointStarted  = "started"
	RecoveryPointFinished = "finished"
)

// Bounds on the key.
const (
	// MaxKeyLength is the limit of idemd's schema (its CHECK constraint).
	// A Store on a narrower column, the article's 100, enforces that
	// instead: see Store.MaxKeyLength.
	MaxKeyLength = 255
	// DefaultMinKeyLength is deliberately 1: a minimum length is a policy of
	// the API (the article used 20), see Options.MinKeyLength.
	DefaultMinKeyLength = 1
)

// Defaults of Options.
const (
	// DefaultLockTimeout is the article's 90 s: past it a lock is considered
	// abandoned by a crashed process and may be taken over.
	DefaultLockTimeout             = 90 * time.Second
	DefaultMaxSerializationRetries = 5
)

// Errors Begin and Execute return. WriteError maps each to its status code
// (see docs/api-authors.md).
var (
	ErrKeyMissing  = errors.New("idem: Idempotency-Key header missing")
	ErrKeyTooShort = errors.New("idem: idempotency key too short")
	ErrKeyTooLong  = errors.New("idem: idempotency key too long")
	// ErrKeyInvalid is a key that is not UTF-8 or contains control
	// characters, which neither PostgreSQL TEXT (NUL) nor the replay
	// signature's canonical string (newlines) can carry.
	ErrKeyInvalid     = errors.New("idem: idempotency key has invalid characters")
	ErrParamsMismatch = errors.New("idem: idempotency key reused with different parameters")
	ErrInProgress     = errors.New("idem: a request with this idempotency key is in progress")
	// ErrConflict is a serialization failure or deadlock that persisted
	// through the internal retries. The key is unlocked; the client should
	// retry.
	ErrConflict = errors.New("idem: conflict with a concurrent request")
	// ErrLockLost means another request took over the key (its lock had
	// timed out) while this one was still working; this one stops.
	ErrLockLost = errors.New("idem: lock on idempotency key lost")
)

// Options tune a Store. The zero value is usable.
type Options struct {
	// LockTimeout after which a locked, unfinished key may be taken over
	// (DefaultLockTimeout when zero). Ages use the database clock.
	LockTimeout time.Duration
	// MinKeyLength applies to keys being created only: an existing key is
	// always found, so tightening the policy never strands a key that the
	// completer is still replaying.
	MinKeyLength int
	// MaxSerializationRetries is how many times a phase is re-run after a
	// serialization failure or deadlock before ErrConflict
	// (DefaultMaxSerializationRetries when zero; negative disables retries).
	MaxSerializationRetries int
	// Isolation of the phases' transactions: ReadCommitted (the zero
	// value) or Serializable. The key protocol is the same at both levels
	// (docs/api-authors.md, "Isolation"); the level is what the API's own
	// statements inside a phase get.
	Isolation Isolation
	// Logger receives failures that cannot be returned (a failed unlock).
	Logger *slog.Logger
}

// Isolation is the isolation level of the phases' transactions.
type Isolation int

const (
	// ReadCommitted phases: the key row is locked FOR UPDATE at the start of
	// every phase, so two requests conflict only when they touch the same
	// key, or rows of the API's own that the API locks. A phase that reads
	// rows of its own and writes based on what it read must lock them
	// itself (SELECT ... FOR UPDATE, or one UPDATE ... SET n = n + 1).
	ReadCommitted Isolation = iota
	// Serializable phases (the article's level), with the same key lock:
	// for phase logic that relies on SERIALIZABLE for rows of the API's
	// own. Unrelated requests can then fail with serialization failures
	// (predicate locks on shared index pages), retried and then answered
	// with ErrConflict (409).
	Serializable
	// ArticleSerializable is the article's protocol as idem ran it before:
	// Begin as one SERIALIZABLE look-up-then-insert, SERIALIZABLE phases
	// without the key row lock. It is kept as the anchor the benchmarks
	// measure the other two against (requests with different keys of one
	// user conflict: 1-7 % of them end in 409); an API gains nothing from
	// it.
	ArticleSerializable
)

func (i Isolation) String() string {
	switch i {
	case ReadCommitted:
		return "read committed"
	case Serializable:
		return "serializable"
	case ArticleSerializable:
		return "article serializable"
	}
	return fmt.Sprintf("Isolation(%d)", int(i))
}

func (i Isolation) txIsoLevel() pgx.TxIsoLevel {
	if i == ReadCommitted {
		return pgx.ReadCommitted
	}
	return pgx.Serializable
}

// Store runs the protocol against one database.
type Store struct {
	pool        *pgxpool.Pool
	lockTimeout time.Duration
	minKeyLen   int
	retries     int
	isolation   Isolation
	logger      *slog.Logger
	// replayNonces is where ReplayAuth records nonces when its verifier
	// has no store of its own; nonceDown tracks its outages for logging.
	replayNonces *ReplayNonces
	nonceDown    outage
	// schema is the idempotency_keys shape found in the database (see
	// schemaFor), nil until read; schemaMu serialises the first read.
	schema   atomic.Pointer[schema]
	schemaMu sync.Mutex
}

// Open returns a Store on pool after reading the shape of the database's
// idempotency_keys table: the type of response_body (TEXT on idemd's
// schema; the article's JSONB is handled too, see Response) and the
// longest key idempotency_key's type and CHECK constraints accept (see
// Store.MaxKeyLength). It fails with an error wrapping ErrSchema, naming
// the fix, when the table is missing or unusable, so an API finds out at
// startup rather than on its first request.
func Open(ctx context.Context, pool *pgxpool.Pool, opts Options) (*Store, error) {
	s := New(pool, opts)
	if _, err := s.schemaFor(ctx); err != nil {
		return nil, err
	}
	return s, nil
}

// New returns a Store on pool without touching the database: the table's
// shape (see Open) is read by the first Begin, which fails, and retries on
// the next, until it can be read.
func New(pool *pgxpool.Pool, opts Options) *Store {
	s := &Store{pool: pool, lockTimeout: opts.LockTimeout, minKeyLen: opts.MinKeyLength, retries: opts.MaxSerializationRetries,
		isolation: opts.Isolation, logger: opts.Logger}
	if s.isolation < ReadCommitted || s.isolation > ArticleSerializable {
		// An unknown level is a programming error; the safe level is the
		// one that does not depend on the API's own locking.
		s.isolation = Serializable
	}
	if s.lockTimeout <= 0 {
		s.lockTimeout = DefaultLockTimeout
	}
	if s.minKeyLen <= 0 {
		s.minKeyLen = DefaultMinKeyLength
	}
	if s.minKeyLen > MaxKeyLength {
		s.minKeyLen = MaxKeyLength
	}
	switch {
	case s.retries == 0:
		s.retries = DefaultMaxSerializationRetries
	case s.retries < 0:
		s.retries = 0
	}
	if s.logger == nil {
		s.logger = slog.New(slog.DiscardHandler)
	}
	s.replayNonces = NewReplayNonces(pool, ReplayNoncesOptions{Logger: s.logger})
	return s
}

// Pool returns the store's pool.
func (s *Store) Pool() *pgxpool.Pool { return s.pool }

// Isolation returns the isolation level of the store's phases.
func (s *Store) Isolation() Isolation { return s.isolation }

// ReplayNonces returns the store ReplayAuth records nonces in when its
// verifier has none of its own (for its Stats).
func (s *Store) ReplayNonces() *ReplayNonces { return s.replayNonces }

// MinKeyLength returns the minimum length enforced for new keys.
func (s *Store) MinKeyLength() int { return s.minKeyLen }

// Key is one idempotency_keys row as this request sees it.
type Key struct {
	ID                 int64
	CreatedAt          time.Time
	UserID             int64
	IdempotencyKey     string
	LastRunAt          time.Time
	LockedAt           *time.Time
	RequestMethod      string
	RequestPath        string
	RequestParams      []byte // canonical JSON
	RequestFingerprint string
	ResponseCode       *int
	ResponseBody       *string
	RecoveryPoint      string
	// UpstreamIdempotencyKey is the key to send to upstream services
	// (Stripe's Idempotency-Key): random, stored once, reused by every retry.
	UpstreamIdempotencyKey uuid.UUID
}

// Finished reports whether the key holds a final response.
func (k *Key) Finished() bool { return k.RecoveryPoint == RecoveryPointFinished }

// Request identifies an incoming request for Begin.
type Request struct {
	UserID int64
	// Key is the Idempotency-Key header value.
	Key    string
	Method string
	Path   string
	// Params are the request's validated parameters, JSON-encodable. Their
	// canonical JSON is what is stored and fingerprinted, so they must be
	// the parsed values (not raw bytes): a replay of the stored params as a
	// JSON body then yields the same fingerprint.
	Params any
}

// ValidateKey checks the header value's presence, characters and
// MaxKeyLength, which need no database. Begin also checks the store's own
// limit (Store.MaxKeyLength, lower on the article's schema) before any
// query, and the minimum length for new keys.
func ValidateKey(key string) error {
	switch {
	case key == "":
		return ErrKeyMissing
	case !utf8.ValidString(key):
		return ErrKeyInvalid
	case utf8.RuneCountInString(key) > MaxKeyLength:
		return fmt.Errorf("%w: at most %d characters", ErrKeyTooLong, MaxKeyLength)
	}
	for _, r := range key {
		if unicode.IsControl(r) {
			return ErrKeyInvalid
		}
	}
	return nil
}
