package completer

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
)

// claimedKey is a key a claim leased to this replica.
type claimedKey struct {
	ID          int64
	UserID      int64
	Key         string
	Method      string
	Path        string
	Params      []byte
	Attempts    int
	Lease       time.Time // its completer_leased_until: every later write checks it
	PastHorizon bool
	TrackedAt   time.Time // its idemd_unfinished_keys.created_at
}

// candidateArgs are the arguments of the candidate query and the claims
// built on it (claimSQL, claimOneSQL, probeCandidatesSQL), limit being
// @batch_size; the walks start at the mark of the current pass.
func (s *Service) candidateArgs(limit int) pgx.NamedArgs {
	s.walk.mu.Lock()
	from := s.walk.state.mark
	s.walk.mu.Unlock()
	return pgx.NamedArgs{
		"from_at":       from.At,
		"from_id":       from.ID,
		"batch_size":    limit,
		"grace":         s.cfg.Grace,
		"idle":          s.cfg.Idle,
		"lock_timeout":  s.cfg.LockTimeout,
		"lease":         s.cfg.Lease,
		"give_up_after": s.cfg.GiveUpAfter,
	}
}

// claim leases up to limit due keys, oldest first.
func (s *Service) claim(ctx context.Context, limit int) ([]claimedKey, error) {
	return s.claimWith(ctx, claimSQL, s.candidateArgs(limit))
}

// claimWith runs claimSQL or claimOneSQL (in a walk transaction: mark.go).
func (s *Service) claimWith(ctx context.Context, sql string, args pgx.NamedArgs) ([]claimedKey, error) {
	var keys []claimedKey
	err := s.inWalkTx(ctx, "completer: claim", func(ctx context.Context, tx pgx.Tx) error {
		rows, err := tx.Query(ctx, sql, args)
		if err != nil {
			return err
		}
		keys, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (claimedKey, error) {
			var k claimedKey
			err := r.Scan(&k.ID, &k.UserID, &k.Key, &k.Method, &k.Path, &k.Params, &k.Attempts, &k.Lease, &k.PastHorizon, &k.TrackedAt)
			return k, err
		})
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("completer: claim: %w", err)
	}
	return keys, nil
}

// dispatchOrder is the order a claimed batch (in claim order, oldest first)
// is sent in. Keys that keep failing pile up at the front of the claim
// order (they are old and their short first backoffs keep them due), so
// sending the batch oldest-first lines them up into the streak of
// consecutive failures that opens the breaker. Alternating the oldest and
// the newest of the batch puts a key that can succeed between any two of
// them; a real outage fails every key in any order and still opens the
// breaker after --breaker-failures. Suspect keys (failing on their own,
// breaker.Suspect) go last: their failures count neither way, and the keys
// that can finish should not wait behind them for the rate limiter.
func dispatchOrder(keys []claimedKey, suspect func(id int64, attempts int) bool) []claimedKey {
	var ok, bad []claimedKey
	for _, k := range keys {
		if suspect(k.ID, k.Attempts) {
			bad = append(bad, k)
		} else {
			ok = append(ok, k)
		}
	}
	out := make([]claimedKey, 0, len(keys))
	for i, j := 0, len(ok)-1; i <= j; i, j = i+1, j-1 {
		out = append(out, ok[i])
		if i != j {
			out = append(out, ok[j])
		}
	}
	return append(out, bad...)
}

// probeCandidate is a due key that could be the half-open probe.
type probeCandidate struct {
	ID        int64
	Attempts  int
	TrackedAt time.Time
}

// chooseProbes orders candidates (given in claim order) by how much a
// probe on them says about the API: first keys that are not suspect (a
// suspect key already failed while the API answered others, so its failure
// says nothing), then fewest attempts, then the newest first (the front of
// the claim order is where keys that keep failing accumulate, see
// dispatchOrder). Without this the probe was always the oldest due key, and
// a key the API can never finish kept the breaker open for everyone.
func chooseProbes(cands []probeCandidate, suspect func(id int64, attempts int) bool) []int64 {
	type ranked struct {
		probeCandidate
		suspect bool
		pos     int
	}
	rs := make([]ranked, len(cands))
	for i, c := range cands {
		rs[i] = ranked{c, suspect(c.ID, c.Attempts), i}
	}
	slices.SortStableFunc(rs, func(a, b ranked) int {
		if a.suspect != b.suspect {
			if a.suspect {
				return 1
			}
			return -1
		}
		if a.Attempts != b.Attempts {
			return a.Attempts - b.Attempts
		}
		return b.pos - a.pos
	})
	ids := make([]int64, len(rs))
	for i, r := range rs {
		ids[i] = r.ID
	}
	return ids
}

// claimProbe leases the one key the half-open breaker probes with: the best
// of the first BatchSize due candidates by chooseProbes. If that key was
// taken meanwhile it tries the next; it claims nothing only when no
// candidate is left.
func (s *Service) claimProbe(ctx context.Context) ([]claimedKey, error) {
	var cands []probeCandidate
	err := s.inWalkTx(ctx, "completer: claim", func(ctx context.Context, tx pgx.Tx) error {
		rows, err := tx.Query(ctx, probeCandidatesSQL, s.candidateArgs(s.cfg.BatchSize))
		if err != nil {
			return err
		}
		cands, err = pgx.CollectRows(rows, pgx.RowToStructByPos[probeCandidate])
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("completer: probe candidates: %w", err)
	}
	tracked := make(map[int64]time.Time, len(cands))
	for _, c := range cands {
		tracked[c.ID] = c.TrackedAt
	}
	for _, id := range chooseProbes(cands, s.breaker.Suspect) {
		args := s.candidateArgs(1)
		args["key_id"], args["tracked_at"] = id, tracked[id]
		keys, err := s.claimWith(ctx, claimOneSQL, args)
		if err != nil || len(keys) > 0 {
			return keys, err
		}
	}
	return nil, nil
}
