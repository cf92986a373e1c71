// Package benchreport runs every benchmark of the suite and writes one table:
// each measurement next to the anchor it is compared with, both measured in
// the same run on the same machine, so the ratios mean something on a noisy
// two-core box even when the absolute numbers drift.
package benchreport

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"
)

// Row is one line of the report.
type Row struct {
	Suite  string
	Name   string
	Value  string // the measurement with its unit
	Ratio  string // against the anchors, e.g. "0.85× single, 14.1× article"
	Target string // the goal from the issue, with met/missed
}

// Report is the whole table.
type Report struct {
	Started time.Time
	Took    time.Duration
	Host    string
	Rows    []Row
	Notes   []string
}

// Write renders the table.
func (r *Report) Write(w io.Writer) error {
	fmt.Fprintf(w, "idemd benchmark report — %s on %s, took %s\n", r.Started.UTC().Format(time.RFC3339), r.Host, r.Took.Round(time.Second))
	fmt.Fprintln(w, "Ratios compare measurements of the same run; read them, not the absolute numbers, across machines.")
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "SUITE\tMEASUREMENT\tVALUE\tRATIO\tTARGET")
	suite := ""
	for _, row := range r.Rows {
		s := row.Suite
		if s == suite {
			s = ""
		} else {
			suite = s
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", s, row.Name, row.Value, row.Ratio, row.Target)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(r.Notes) > 0 {
		fmt.Fprintln(w)
		for _, n := range r.Notes {
			fmt.Fprintln(w, "- "+n)
		}
	}
	return nil
}

// Goal formats a target and whether it was met.
func Goal(text string, met bool) string {
	if met {
		return text + " (met)"
	}
	return text + " (MISSED)"
}

// Ratio formats "0.85× name".
func Ratio(v float64, against string) string {
	return fmt.Sprintf("%.2f× %s", v, against)
}

// Join joins non-empty parts with ", ".
func Join(parts ...string) string {
	var out []string
	for _, p := range parts {
		if p != "" {
			out = append(out, p)
		}
	}
	return strings.Join(out, ", ")
}

// Dur formats a duration with a sensible precision.
func Dur(d time.Duration) string {
	switch {
	case d < time.Millisecond:
		return fmt.Sprintf("%.3f ms", float64(d)/float64(time.Millisecond))
	case d < time.Second:
		return fmt.Sprintf("%.1f ms", float64(d)/float64(time.Millisecond))
	default:
		return d.Round(10 * time.Millisecond).String()
	}
}
