package idem

import (
	"context"
	"fmt"
)

// Phases maps each recovery point (except finished) to the phase that runs
// from it.
type Phases map[string]PhaseFunc

// Outcome is the final response of a key.
type Outcome struct {
	Status int
	Body   []byte
	// Replayed is true when the key was already finished before this
	// request: the response is the stored one.
	Replayed bool
	Key      *Key
}

// Execute runs the whole protocol: Begin, then the phase for the key's
// recovery point until it is finished, and returns the stored response.
// Errors are Begin's, a phase's *ResponseError, ErrConflict, ErrLockLost, or
// an internal error; in every case the key has been unlocked.
func (s *Store) Execute(ctx context.Context, req Request, phases Phases) (*Outcome, error) {
	k, err := s.Begin(ctx, req)
	if err != nil {
		return nil, err
	}
	replayed := k.Finished()
	for !k.Finished() {
		fn, ok := phases[k.RecoveryPoint]
		if !ok {
			s.Unlock(ctx, k)
			return nil, fmt.Errorf("idem: execute: no phase for recovery point %q", k.RecoveryPoint)
		}
		if err := s.Phase(ctx, k, fn); err != nil {
			return nil, err
		}
	}
	out := &Outcome{Replayed: replayed, Key: k}
	if k.ResponseCode != nil {
		out.Status = *k.ResponseCode
	}
	if k.ResponseBody != nil {
		out.Body = []byte(*k.ResponseBody)
	}
	if out.Status == 0 {
		return nil, fmt.Errorf("idem: execute: key %d is finished without a response code", k.ID)
	}
	return out, nil
}
