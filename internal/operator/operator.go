// Package operator is idemd's one operator core: every operator read
// (status, a key, reviews, dead letters, the reaper's runs through
// runhistory, the audit) and every operator write (retry a key, requeue a
// dead letter, resolve a review, pause or resume the reaper), each write
// recorded with who, when and why in idemd_operator_actions
// (migrations/00017), with one actor check and one set of refusals
// (ErrNotFound, ErrRefused: idemctl's exit 3).
//
// Two thin faces use it and nothing else: idemctl (internal/ctl) prints
// what these functions return, as text or with -o json, and the web
// console (internal/console) renders the same values as HTML and performs
// the same writes from POST forms. Nothing here is a second definition of a
// service's rule: status counts with the services' own functions
// (enqueuer.Backlog, completer.CountUnfinished, reaper.PlanRun,
// dbstats.CountJobs, review.Open), a resolution is review.Resolve, and a
// retry resets exactly the columns the completer reads to decide it gave up
// (internal/completer, unfinished and giveUp).
package operator

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Via values recorded in idemd_operator_actions.via.
const (
	ViaIdemctl = "idemctl"
	ViaConsole = "console"
)

// Actions recorded in idemd_operator_actions.action.
const (
	ActionKeyRetry     = "key_retry"
	ActionDeadRequeue  = "dead_requeue"
	ActionReaperPause  = "reaper_pause"
	ActionReaperResume = "reaper_resume"
)

// ErrNotFound: the key, dead letter or review does not exist (any more).
// idemctl exits 3 (daemon.ExitRefused): retrying will not find it.
var ErrNotFound error = refusal("not found")

// ErrRefused: the action does not apply to the row as it is now (a
// finished key, a key the completer is replaying right now). The error's
// text says why; idemctl exits 3 (daemon.ExitRefused).
var ErrRefused error = refusal("refused")

// refusal is the type of ErrNotFound and ErrRefused: a daemon.Refusal, so
// an error wrapping either maps to exit 3 without this package importing
// the runtime.
type refusal string

func (r refusal) Error() string { return string(r) }

// Refusal marks the error as daemon.Refusal.
func (refusal) Refusal() {}

// DB is satisfied by *pgxpool.Pool, *pgx.Conn and pgx.Tx.
type DB interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// TxDB is a DB that can begin a transaction (a pool or a connection).
type TxDB interface {
	DB
	Begin(ctx context.Context) (pgx.Tx, error)
}

// Actor is who performs an action and through which face.
type Actor struct {
	By  string // the operator's identity, never empty
	Via string // ViaIdemctl or ViaConsole
}

// check reports what is wrong with an actor and a note, every problem at
// once (the command turns them into exit 2, the page into a 400).
func checkActor(a Actor, note string) error {
	var p []string
	if strings.TrimSpace(a.By) == "" {
		p = append(p, "an operator identity is required (--by or IDEMD_OPERATOR; in the console --operator or the proxy's header)")
	}
	if strings.TrimSpace(note) == "" {
		p = append(p, "a note is required: say why this is safe now")
	}
	if a.Via == "" {
		p = append(p, "internal: Via is empty")
	}
	if len(p) > 0 {
		return fmt.Errorf("%w: %s", ErrRefused, strings.Join(p, "; "))
	}
	return nil
}
