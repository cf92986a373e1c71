package ctl

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/idemd/idemd/internal/operator"
	"github.com/idemd/idemd/internal/riverdb"
)

// KeysCmd groups the key subcommands.
type KeysCmd struct {
	Show  KeysShowCmd  `cmd:"" help:"Show one key: recovery point, request, completer attempts, lease, reviews, operator actions and linked jobs."`
	Retry KeysRetryCmd `cmd:"" help:"Hand a given-up or failing key back to the completer (recorded with --by and --note)."`
}

// KeyFlags name one key. The key is a command's target, so it is read from
// the command line only (env:"-"): a variable left in a shell or a pod must
// never choose which key keys retry changes.
type KeyFlags struct {
	ID     int64  `name:"id" env:"-" help:"The key's id (idempotency_keys.id, the KEY_ID of review list)."`
	UserID int64  `name:"user-id" env:"-" help:"The key's user (with --key)."`
	Key    string `name:"key" env:"-" help:"The idempotency key the client sent (with --user-id)."`
	// GiveUpAfter is the completer's --give-up-after; IDEMD_GIVE_UP_AFTER
	// is the completer's own variable, so one setting serves both.
	GiveUpAfter time.Duration `name:"give-up-after" default:"${give_up_after}" help:"The completer's --give-up-after: a key older than this is given up at its next claim, so it is not retried."`
}

func (f KeyFlags) ref() operator.KeyRef {
	return operator.KeyRef{ID: f.ID, UserID: f.UserID, Key: f.Key}
}

func (f KeyFlags) problems() []string {
	p := f.ref().Check()
	if f.GiveUpAfter <= 0 {
		p = append(p, "--give-up-after must be positive")
	}
	return p
}

// KeysShowCmd prints one key's report.
type KeysShowCmd struct {
	KeyFlags `embed:""`
	Output   `embed:""`
}

// Validate reports every problem with the flags (exit 2).
func (c *KeysShowCmd) Validate() error { return problems(c.KeyFlags.problems()) }

// Run prints the report.
func (c *KeysShowCmd) Run(ctx context.Context, g *Globals) error {
	rep, err := operator.ShowKey(ctx, g.Pool, c.ref(), c.GiveUpAfter)
	if err != nil {
		return named("keys show", err)
	}
	if c.JSON() {
		return writeJSON(g.Stdout, rep)
	}
	return writeKeyReport(g.Stdout, rep)
}

func writeKeyReport(w io.Writer, rep *operator.KeyReport) error {
	now := rep.At
	fmt.Fprintf(w, "%s at %s\n\n", rep.Ref, now.UTC().Format(time.RFC3339))
	if k := rep.Key; k != nil {
		resp := "-"
		if k.ResponseCode != nil {
			resp = strconv.Itoa(int(*k.ResponseCode))
			if k.ResponseBody != nil {
				resp += " " + oneLine(*k.ResponseBody)
			}
		}
		horizon := "within"
		if rep.PastGiveUpHorizon {
			horizon = "PAST"
		}
		tracked := "yes"
		if !rep.Tracked {
			tracked = "no (the completer does not look at it)"
		}
		writeLines(w, [][2]string{
			{"id", strconv.FormatInt(k.ID, 10)},
			{"user", strconv.FormatInt(k.UserID, 10)},
			{"idempotency key", k.IdempotencyKey},
			{"state", rep.State},
			{"recovery point", k.RecoveryPoint},
			{"request", k.RequestMethod + " " + k.RequestPath},
			{"params", string(k.RequestParams)},
			{"fingerprint", orDash(k.RequestFingerprint)},
			{"upstream key", orDash(k.UpstreamIdempotencyKey)},
			{"created", ts(&k.CreatedAt) + " (" + since(now, &k.CreatedAt) + " ago)"},
			{"last run", ts(&k.LastRunAt) + " (" + since(now, &k.LastRunAt) + " ago)"},
			{"locked at", ts(k.LockedAt)},
			{"response", resp},
			{"attempts", strconv.Itoa(int(k.CompleterAttempts))},
			{"next attempt", ts(k.CompleterNextAttemptAt)},
			{"lease until", ts(k.CompleterLeasedUntil)},
			{"last error", orDash(k.CompleterLastError)},
			{"gave up at", ts(k.CompleterGaveUpAt)},
			{"tracked", tracked},
			{"give-up horizon", horizon + " --give-up-after " + rep.GiveUpAfter},
		})
	} else {
		writeLines(w, [][2]string{
			{"id", strconv.FormatInt(rep.KeyID, 10)},
			{"state", rep.State + " (the row is deleted; its reviews below keep a snapshot)"},
		})
	}

	fmt.Fprintln(w, "\nREVIEWS")
	if len(rep.Reviews) == 0 {
		fmt.Fprintln(w, "  none")
	} else {
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "  ID\tREASON\tFLAGGED_AT\tFLAGGED_BY\tRESOLVED_AT\tRESOLVED_BY\tNOTE")
		for _, r := range rep.Reviews {
			fmt.Fprintf(tw, "  %d\t%s\t%s\t%s\t%s\t%s\t%s\n", r.ID, r.Reason, ts(&r.FlaggedAt), r.FlaggedBy,
				ts(r.ResolvedAt), orDash(r.ResolvedBy), oneLine(deref(r.ResolutionNote)))
		}
		tw.Flush()
	}
	writeActions(w, rep.Actions)

	fmt.Fprintf(w, "\nJOBS (metadata %q)\n", rep.Jobs.LinkKey)
	if len(rep.Jobs.Staged)+len(rep.Jobs.Dead)+len(rep.Jobs.River) == 0 {
		fmt.Fprintf(w, "  none found: %s\n", rep.Jobs.Note)
	} else {
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "  WHERE\tID\tKIND\tSTATE\tCREATED_AT\tDETAIL")
		for _, j := range rep.Jobs.Staged {
			fmt.Fprintf(tw, "  staged_jobs\t%d\t%s\t%s\t%s\t\n", j.ID, j.Kind, j.State, ts(&j.CreatedAt))
		}
		for _, j := range rep.Jobs.Dead {
			fmt.Fprintf(tw, "  staged_jobs_dead\t%d\t%s\t%s\t%s\t%s\n", j.ID, j.Kind, j.State, ts(&j.CreatedAt), oneLine(orDash(j.Reason)))
		}
		for _, j := range rep.Jobs.River {
			staged := "-"
			if j.StagedID != nil {
				staged = "staged id " + strconv.FormatInt(*j.StagedID, 10)
			}
			fmt.Fprintf(tw, "  %s\t%d\t%s\t%s\t%s\t%s\n", riverdb.JobTable, j.ID, j.Kind, j.State, ts(&j.CreatedAt), staged)
		}
		tw.Flush()
	}

	fmt.Fprintln(w)
	if rep.Retryable {
		_, err := fmt.Fprintf(w, "retry: idemctl keys retry --id %d --by WHO --note WHY\n", rep.KeyID)
		return err
	}
	_, err := fmt.Fprintf(w, "retry: not possible: %s\n", rep.WhyNot)
	return err
}

func writeActions(w io.Writer, actions []operator.Action) {
	fmt.Fprintln(w, "\nOPERATOR ACTIONS")
	if len(actions) == 0 {
		fmt.Fprintln(w, "  none")
		return
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "  ID\tAT\tACTOR\tACTION\tVIA\tNOTE")
	for _, a := range actions {
		fmt.Fprintf(tw, "  %d\t%s\t%s\t%s\t%s\t%s\n", a.ID, ts(&a.At), a.Actor, a.Action, a.Via, oneLine(a.Note))
	}
	tw.Flush()
}

// KeysRetryCmd hands a key back to the completer.
type KeysRetryCmd struct {
	KeyFlags `embed:""`
	Operator `embed:""`
}

// Validate reports every problem with the flags (exit 2).
func (c *KeysRetryCmd) Validate() error {
	return problems(append(c.KeyFlags.problems(), c.Operator.problems()...))
}

// Run retries the key.
func (c *KeysRetryCmd) Run(ctx context.Context, g *Globals) error {
	c.Operator.announce(g)
	res, err := operator.RetryKey(ctx, g.Pool, operator.RetryRequest{
		Ref: c.ref(), Actor: c.actor(), Note: c.Note, GiveUpAfter: c.GiveUpAfter,
	})
	if err != nil {
		return named("keys retry", err)
	}
	resolved := ""
	if len(res.ResolvedReviews) > 0 {
		ids := make([]string, len(res.ResolvedReviews))
		for i, id := range res.ResolvedReviews {
			ids[i] = strconv.FormatInt(id, 10)
		}
		resolved = "; resolved review " + strings.Join(ids, ", ")
	}
	_, err = fmt.Fprintf(g.Stdout, "key %d handed back to the completer by %s at %s (was %d attempts%s; action %d%s)\n",
		res.KeyID, res.By, res.At.UTC().Format(time.RFC3339), res.PreviousAttempts, givenUp(res.WasGivenUp), res.ActionID, resolved)
	return err
}

func givenUp(b bool) string {
	if b {
		return ", given up"
	}
	return ""
}
