package reaper

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// Plan is what a run would do now, by the reaper's own rules (sql.go's
// eligible: past retention, not in flight, not leased by the completer).
type Plan struct {
	// Deletes: keys a run would delete.
	Deletes int64 `json:"deletes"`
	// Flags: reviews it would create in doing so.
	Flags int64 `json:"flags"`
	// Oldest is the created_at of the oldest key it would delete; nil when
	// there is none.
	Oldest *time.Time `json:"oldest,omitempty"`
	// ToFlag lists, for a dry run, the first keys it would flag, oldest
	// first (at most dryRunListLimit).
	ToFlag []FlagCandidate `json:"to_flag,omitempty"`
}

// FlagCandidate is a key a run would flag for review as it deletes it.
type FlagCandidate struct {
	ID             int64     `json:"id"`
	UserID         int64     `json:"user_id"`
	IdempotencyKey string    `json:"idempotency_key"`
	RecoveryPoint  string    `json:"recovery_point"`
	CreatedAt      time.Time `json:"created_at"`
	Reason         string    `json:"reason"`
}

// Querier runs the reaper's exported read queries: a pool, a connection or
// a transaction (idemctl status reads everything in one snapshot).
type Querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// PlanRun counts what a run with these eligibility settings would delete
// and flag now: the one definition of "keys past retention" that idemctl
// status shows. It locks and changes nothing. Like a dry run it visits the
// heap row of every key past retention (the lock and lease rules read
// columns no index holds).
func PlanRun(ctx context.Context, db Querier, e Eligibility) (*Plan, error) {
	return plan(ctx, db, eligibilityArgs(e, nil), nil)
}

// plan counts the eligible keys and the reviews they would need. limit
// bounds the count (nil: count everything).
func plan(ctx context.Context, db Querier, args pgx.NamedArgs, limit *int64) (*Plan, error) {
	args["limit"] = limit
	p := &Plan{}
	if err := db.QueryRow(ctx, planSQL, args).Scan(&p.Deletes, &p.Flags, &p.Oldest); err != nil {
		return nil, fmt.Errorf("reaper: plan: %w", err)
	}
	return p, nil
}

// checkCaps refuses a run that would exceed --max-deletes or --max-flags
// before it deletes anything. The count stops one past the delete cap, so
// it costs no more than the run it guards.
func (s *Service) checkCaps(ctx context.Context) error {
	if s.cfg.MaxDeletes == 0 && s.cfg.MaxFlags == 0 {
		return nil
	}
	var limit *int64
	if s.cfg.MaxDeletes > 0 {
		l := s.cfg.MaxDeletes + 1
		limit = &l
	}
	var p *Plan
	err := s.cfg.Calls.DoWithin(ctx, planOp, s.cfg.MaxRuntime, func(ctx context.Context) (err error) {
		p, err = plan(ctx, s.cfg.Pool, eligibilityArgs(s.cfg.Eligibility, s.pinnedNow), limit)
		return err
	})
	if err != nil {
		return err
	}
	if s.cfg.MaxDeletes > 0 && p.Deletes > s.cfg.MaxDeletes {
		return fmt.Errorf("reaper: more than %d keys are past retention, the --max-deletes cap; nothing was deleted (check --retention, or raise the cap): %w", s.cfg.MaxDeletes, ErrCapExceeded)
	}
	if s.cfg.MaxFlags > 0 && p.Flags > s.cfg.MaxFlags {
		return fmt.Errorf("reaper: %d keys past retention would be flagged for review, more than the --max-flags cap %d; nothing was deleted (is the completer running?): %w", p.Flags, s.cfg.MaxFlags, ErrCapExceeded)
	}
	return nil
}

// dryRunListLimit bounds the keys a dry run lists one by one.
const dryRunListLimit = 100

// planOp names the counts of keys past retention (the cap check, a dry
// run) when they run out of their bound: --max-runtime, since a count
// visits every key past retention, and a run may take no longer.
const planOp = "reaper plan"

// dryRun plans what a run would do now, changing nothing; the command
// prints it.
func (s *Service) dryRun(ctx context.Context) (p *Plan, err error) {
	err = s.cfg.Calls.DoWithin(ctx, planOp, s.cfg.MaxRuntime, func(ctx context.Context) (err error) {
		p, err = s.dryRunPlan(ctx)
		return err
	})
	return p, err
}

func (s *Service) dryRunPlan(ctx context.Context) (*Plan, error) {
	p, err := plan(ctx, s.cfg.Pool, eligibilityArgs(s.cfg.Eligibility, s.pinnedNow), nil)
	if err != nil {
		return nil, err
	}
	args := eligibilityArgs(s.cfg.Eligibility, s.pinnedNow)
	args["limit"] = dryRunListLimit
	rows, err := s.cfg.Pool.Query(ctx, planFlagsSQL, args)
	if err != nil {
		return nil, fmt.Errorf("reaper: dry run list: %w", err)
	}
	p.ToFlag, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (FlagCandidate, error) {
		var c FlagCandidate
		err := r.Scan(&c.ID, &c.UserID, &c.IdempotencyKey, &c.RecoveryPoint, &c.CreatedAt, &c.Reason)
		return c, err
	})
	if err != nil {
		return nil, fmt.Errorf("reaper: dry run list: %w", err)
	}
	return p, nil
}
