package soak

import (
	"encoding/csv"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"
)

// columns are the samples' CSV columns for the processes and indexes of
// a run.
type columns struct {
	procs   []string
	indexes []string
}

func (c columns) header() []string {
	h := []string{"t_s", "api_responses_per_s", "client_responses", "client_p50_ms", "client_p99_ms"}
	for _, p := range c.procs {
		h = append(h, "rss_mb_"+p, "goroutines_"+p)
	}
	for _, a := range append(append([]string(nil), AppNames...), otherApps) {
		h = append(h, "conns_"+a)
	}
	for _, t := range Tables {
		h = append(h, t+"_heap_mb", t+"_total_mb", t+"_live", t+"_dead", t+"_autovacuums", t+"_autoanalyzes")
	}
	for _, i := range c.indexes {
		h = append(h, "index_mb_"+i)
	}
	return append(h, "xacts_per_s", "horizon_xacts", "horizon_s", "horizon_holder", "horizon_holder_in_xact_s",
		"slot_xacts", "prepared_xacts", "staged", "staged_oldest_s", "open_keys", "reviews", "reaper_deleted", "river_pending")
}

func (c columns) row(s Sample) []string {
	f := func(v float64, prec int) string { return strconv.FormatFloat(v, 'f', prec, 64) }
	i := func(v int64) string { return strconv.FormatInt(v, 10) }
	mbs := func(b int64) string { return f(float64(b)/(1<<20), 2) }
	ms := func(d time.Duration) string { return f(float64(d)/float64(time.Millisecond), 1) }
	r := []string{f(s.At.Seconds(), 0), f(s.APIRate, 1), strconv.Itoa(s.ClientResponses), ms(s.ClientP50), ms(s.ClientP99)}
	for _, p := range c.procs {
		r = append(r, mbs(s.Procs[p].RSS), strconv.Itoa(s.Procs[p].Goroutines))
	}
	for _, a := range append(append([]string(nil), AppNames...), otherApps) {
		r = append(r, strconv.Itoa(s.Conns[a]))
	}
	for _, t := range Tables {
		ts := s.Tables[t]
		r = append(r, mbs(ts.Heap), mbs(ts.Total), i(ts.Live), i(ts.Dead), i(ts.Autovacuums), i(ts.Autoanalyzes))
	}
	for _, ix := range c.indexes {
		r = append(r, mbs(s.Indexes[ix]))
	}
	return append(r, f(s.XIDRate, 0), i(s.Horizon.Age), f(s.Horizon.Seconds(s.XIDRate), 2), s.Horizon.Holder, f(s.Horizon.HeldFor.Seconds(), 1),
		i(s.Horizon.Slot), i(s.Horizon.Prepared), i(s.Staged), f(s.StagedOldest.Seconds(), 1), i(s.OpenKeys), i(s.Reviews), f(s.ReaperDeleted, 0), i(s.RiverPending))
}

// csvWriter writes the samples as they are taken, so a soak that fails
// midway leaves what it saw.
type csvWriter struct {
	w    *csv.Writer
	cols columns
}

func newCSVWriter(out io.Writer, cols columns) (*csvWriter, error) {
	w := csv.NewWriter(out)
	if err := w.Write(cols.header()); err != nil {
		return nil, fmt.Errorf("soak: samples: %w", err)
	}
	w.Flush()
	return &csvWriter{w: w, cols: cols}, w.Error()
}

func (c *csvWriter) write(s Sample) error {
	if err := c.w.Write(c.cols.row(s)); err != nil {
		return fmt.Errorf("soak: samples: %w", err)
	}
	c.w.Flush()
	return c.w.Error()
}

// line is a sample in one line of the log and the text report: the
// figures the flatness checks read, and what explains them.
func line(s Sample, daemons []string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%6s  api %5.1f/s p50 %5.1fms p99 %6.1fms  RSS", s.At.Round(time.Second), s.APIRate,
		float64(s.ClientP50)/float64(time.Millisecond), float64(s.ClientP99)/float64(time.Millisecond))
	for _, d := range daemons {
		fmt.Fprintf(&b, " %.0f", float64(s.Procs[d].RSS)/(1<<20))
	}
	b.WriteString(" MB  gor")
	for _, d := range daemons {
		fmt.Fprintf(&b, " %d", s.Procs[d].Goroutines)
	}
	conns := 0
	for _, n := range s.Conns {
		conns += n
	}
	fmt.Fprintf(&b, "  conns %d", conns)
	for _, t := range Tables {
		ts := s.Tables[t]
		fmt.Fprintf(&b, "  %s %.1fMB %d/%d av%d", short(t), float64(ts.Total)/(1<<20), ts.Live, ts.Dead, ts.Autovacuums)
	}
	fmt.Fprintf(&b, "  %.0f xact/s  horizon %d (%.1fs) %s  backlog %d  open %d  reaped %.0f  river pending %d",
		s.XIDRate, s.Horizon.Age, s.Horizon.Seconds(s.XIDRate), orNone(s.Horizon.Holder), s.Staged, s.OpenKeys, s.ReaperDeleted, s.RiverPending)
	return b.String()
}

// lineHeader explains line's fields.
func lineHeader(daemons []string) string {
	return fmt.Sprintf("time, API responses/s and the clients' p50/p99; RSS and goroutines of %s; sessions; per table (keys, staged, river) total size, live/dead tuples, autovacuums; transactions/s; xmin horizon age in transactions (in seconds of them) and holder; staged rows; unfinished keys; keys reaped; River jobs not yet worked",
		strings.Join(daemons, ", "))
}

func short(table string) string {
	switch table {
	case "idempotency_keys":
		return "keys"
	case "staged_jobs":
		return "staged"
	case "river_job":
		return "river"
	}
	return table
}
