package ctl

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/idemd/idemd/internal/operator"
)

// ReviewCmd groups the review subcommands.
type ReviewCmd struct {
	List    ReviewListCmd    `cmd:"" help:"List keys flagged for review (open ones by default)."`
	Resolve ReviewResolveCmd `cmd:"" help:"Mark a review resolved, recording who, when and a note."`
}

// ReviewListCmd lists reviews.
type ReviewListCmd struct {
	Reason    string        `name:"reason" help:"Only this reason (unfinished_at_retention, completer_gave_up, ...)."`
	OlderThan time.Duration `name:"older-than" help:"Only reviews flagged longer ago than this (e.g. 24h)."`
	NewerThan time.Duration `name:"newer-than" help:"Only reviews flagged more recently than this."`
	State     string        `name:"state" default:"open" enum:"open,resolved,all" help:"Which reviews: open, resolved or all."`
	Limit     int           `name:"limit" default:"100" help:"At most this many, oldest first."`
	Output    `embed:""`
}

// Validate reports every problem with the list flags (exit 2).
func (c *ReviewListCmd) Validate() error {
	var p []string
	if c.OlderThan < 0 || c.NewerThan < 0 {
		p = append(p, "--older-than and --newer-than must not be negative")
	}
	if c.OlderThan > 0 && c.NewerThan > 0 && c.NewerThan <= c.OlderThan {
		p = append(p, "--newer-than must be longer than --older-than, or nothing matches")
	}
	if c.Limit < 1 {
		p = append(p, "--limit must be at least 1")
	}
	return problems(p)
}

// Review is one row of idempotency_key_reviews, as listed.
type Review = operator.Review

// Run lists the reviews.
func (c *ReviewListCmd) Run(ctx context.Context, g *Globals) error {
	reviews, err := operator.ListReviews(ctx, g.Pool, operator.ReviewFilter{
		Reason: c.Reason, OlderThan: c.OlderThan, NewerThan: c.NewerThan, State: c.State, Limit: c.Limit,
	})
	if err != nil {
		return err
	}
	if c.JSON() {
		return writeJSON(g.Stdout, reviews)
	}
	return writeReviewTable(g.Stdout, reviews, c.State != "open")
}

func writeReviewTable(w io.Writer, reviews []Review, withResolution bool) error {
	if len(reviews) == 0 {
		_, err := fmt.Fprintln(w, "no reviews match")
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	header := "ID\tKEY_ID\tUSER_ID\tIDEMPOTENCY_KEY\tREASON\tRECOVERY_POINT\tFLAGGED_AT\tAGE\tFLAGGED_BY"
	if withResolution {
		header += "\tRESOLVED_AT\tRESOLVED_BY\tNOTE"
	}
	fmt.Fprintln(tw, header)
	for _, r := range reviews {
		fmt.Fprintf(tw, "%d\t%d\t%d\t%s\t%s\t%s\t%s\t%s\t%s", r.ID, r.KeyID, r.UserID, r.IdempotencyKey, r.Reason,
			deref(r.RecoveryPoint), r.FlaggedAt.UTC().Format(time.RFC3339), operator.AgeSeconds(r.AgeSeconds), r.FlaggedBy)
		if withResolution {
			resolvedAt := ""
			if r.ResolvedAt != nil {
				resolvedAt = r.ResolvedAt.UTC().Format(time.RFC3339)
			}
			fmt.Fprintf(tw, "\t%s\t%s\t%s", resolvedAt, deref(r.ResolvedBy), oneLine(deref(r.ResolutionNote)))
		}
		fmt.Fprintln(tw)
	}
	return tw.Flush()
}

// ReviewResolveCmd resolves one review.
type ReviewResolveCmd struct {
	ID int64 `arg:"" name:"id" help:"The review's id (the ID column of review list)."`
	// By is required, as for keys retry and dead requeue (Operator): the
	// OS user is never assumed, since "root" or "ubuntu" on a shared
	// bastion tells no one who resolved the review.
	Operator `embed:""`
}

// Validate reports every problem with the resolve arguments (exit 2).
func (c *ReviewResolveCmd) Validate() error {
	var p []string
	if c.ID < 1 {
		p = append(p, "<id> must be a positive review id")
	}
	return problems(append(p, c.Operator.problems()...))
}

// Run resolves the review, refusing one already resolved so a note is never
// overwritten (operator.ResolveReview).
func (c *ReviewResolveCmd) Run(ctx context.Context, g *Globals) error {
	c.Operator.announce(g)
	res, err := operator.ResolveReview(ctx, g.Pool, c.ID, c.actor(), c.Note)
	if err != nil {
		return named("review resolve", err)
	}
	_, err = fmt.Fprintf(g.Stdout, "review %d resolved by %s at %s\n", res.ID, res.By, ts(&res.At))
	return err
}

func problems(p []string) error {
	if len(p) == 0 {
		return nil
	}
	return errors.New(strings.Join(p, "; "))
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

func oneLine(s string) string {
	s = strings.ReplaceAll(s, "\n", " ")
	if len(s) > 60 {
		s = s[:57] + "..."
	}
	return s
}

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		return fmt.Errorf("write json: %w", err)
	}
	return nil
}
