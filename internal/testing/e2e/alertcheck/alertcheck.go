// Package alertcheck checks idemd's alerts against what the daemons really
// exported during a run: a Recorder scrapes their /metrics at a fixed
// interval, as Prometheus would, and Evaluate hands the samples to
// Prometheus' own `promtool test rules` with the alerting rules of
// deploy/observability, asking whether each alert fired (or stayed silent)
// in a window of the run.
//
// Recording. Every Interval the Recorder scrapes every target at once and
// stamps the round with its real start time. The samples go into promtool's
// input_series with `interval` equal to the scrape interval: a round's
// samples are placed at the step nearest its real start (rounds run on a
// ticker, so that is within milliseconds), a step with no round is `_`, and,
// as Prometheus does, a series that a target stopped exporting, or every
// series of a target whose scrape failed, gets a staleness marker. Each
// target also gets `up` (1 scraped, 0 not), the series Prometheus makes
// itself. The real timestamps are written next to the test file
// (scrapes.tsv).
//
// Evaluating. The run is minutes long and most alerts have a `for:` of
// 5 to 60 minutes, so StripFor removes `for:` from every alert: an alert
// then "fires" at each evaluation where its expression is true, and a Check
// asserts the expression became true (or never did) while a fault lasted.
// promtool evaluates the rules every Interval over the recorded series and
// each Check is a promql_expr_test over the ALERTS series the rules wrote:
//
//	label_replace(clamp_max(count(max_over_time(ALERTS{alertstate="firing",alertname="X",...}[W])), 1) or vector(0), "check", NAME, "", "")
//
// at the window's last round, which is 1 when the alert fired at any
// evaluation of the window and 0 when it never did.
package alertcheck

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"sigs.k8s.io/yaml"
)

// Target is one scrape target.
type Target struct {
	// URL of its /metrics.
	URL string
	// Labels are added to every series scraped from it and to its `up`,
	// as Prometheus' service discovery adds namespace, pod and container.
	Labels map[string]string
}

// Sample is one value of one series in a round.
type Sample struct {
	Name   string
	Labels map[string]string
	Value  float64
}

// Options configure a Recorder.
type Options struct {
	// Interval between scrape rounds: also promtool's input_series
	// interval and its evaluation_interval.
	Interval time.Duration
	Targets  []Target
	// Keep says which metric names to record (nil: all). The input file
	// need only hold the series the rules read.
	Keep func(name string) bool
	// Probe, optional, adds series of its own each round: what another
	// exporter would have reported (the suite derives kube-state-metrics'
	// Deployment availability from the daemons' /readyz).
	Probe func(ctx context.Context) []Sample
	// Client for the scrapes; nil: one with a timeout below Interval.
	Client *http.Client
}

// Round is one scrape round as it happened.
type Round struct {
	Step     int
	Start    time.Time
	Duration time.Duration
	Up       int // targets scraped
	Down     []string
}

// Recorder scrapes targets and keeps what it saw, step by step.
type Recorder struct {
	o Options

	mu      sync.Mutex
	origin  time.Time // step 0
	series  map[string]*series
	prev    map[int]map[string]bool // by target index (-1: the probe): series seen in its last round
	rounds  []Round
	roundCh chan struct{} // closed and replaced after every round

	stop chan struct{}
	done chan struct{}
}

type series struct {
	name   string
	labels map[string]string
	values map[int]float64
	stale  map[int]bool
}

// NewRecorder returns a Recorder whose step 0 is origin.
func NewRecorder(o Options, origin time.Time) *Recorder {
	if o.Keep == nil {
		o.Keep = func(string) bool { return true }
	}
	if o.Client == nil {
		o.Client = &http.Client{Timeout: o.Interval * 8 / 10}
	}
	return &Recorder{
		o: o, origin: origin, series: map[string]*series{}, prev: map[int]map[string]bool{},
		roundCh: make(chan struct{}),
	}
}

// Start scrapes a round now and then every Interval until Stop.
func (r *Recorder) Start(ctx context.Context) {
	r.stop, r.done = make(chan struct{}), make(chan struct{})
	go func() {
		defer close(r.done)
		t := time.NewTicker(r.o.Interval)
		defer t.Stop()
		for {
			r.Scrape(ctx, time.Now())
			select {
			case <-r.stop:
				return
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	}()
}

// Stop ends the rounds started by Start and waits for the last one.
func (r *Recorder) Stop() {
	if r.stop == nil {
		return
	}
	select {
	case <-r.stop:
	default:
		close(r.stop)
	}
	<-r.done
	if r.o.Client != nil {
		r.o.Client.CloseIdleConnections()
	}
}

// step is the input_series step nearest t.
func (r *Recorder) step(t time.Time) int {
	d := t.Sub(r.origin)
	return int((d + r.o.Interval/2) / r.o.Interval)
}

// Scrape runs one round that started at start: every target at once, then
// the probe.
func (r *Recorder) Scrape(ctx context.Context, start time.Time) {
	type result struct {
		samples []Sample
		err     error
	}
	results := make([]result, len(r.o.Targets))
	var wg sync.WaitGroup
	for i, tg := range r.o.Targets {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s, err := r.scrape(ctx, tg)
			results[i] = result{s, err}
		}()
	}
	var probe []Sample
	if r.o.Probe != nil {
		wg.Add(1)
		go func() { defer wg.Done(); probe = r.o.Probe(ctx) }()
	}
	wg.Wait()

	r.mu.Lock()
	defer r.mu.Unlock()
	step := r.step(start)
	round := Round{Step: step, Start: start, Duration: time.Since(start)}
	for i, res := range results {
		tl := r.o.Targets[i].Labels
		up := 1.0
		if res.err != nil {
			up = 0
			round.Down = append(round.Down, fmt.Sprintf("%s: %v", seriesString("", tl), res.err))
		} else {
			round.Up++
		}
		r.record(step, Sample{Name: "up", Labels: tl, Value: up}, nil)
		r.observe(i, step, res.samples, tl)
	}
	if r.o.Probe != nil {
		r.observe(-1, step, probe, nil)
	}
	r.rounds = append(r.rounds, round)
	close(r.roundCh)
	r.roundCh = make(chan struct{})
}

// observe records one source's samples at step and marks stale what it
// exported in its previous round and not in this one (all of it, when the
// scrape failed and samples is nil).
func (r *Recorder) observe(source, step int, samples []Sample, targetLabels map[string]string) {
	seen := map[string]bool{}
	for _, s := range samples {
		if !r.o.Keep(s.Name) {
			continue
		}
		seen[r.record(step, s, targetLabels)] = true
	}
	for k := range r.prev[source] {
		if !seen[k] {
			r.series[k].stale[step] = true
		}
	}
	r.prev[source] = seen
}

func (r *Recorder) record(step int, s Sample, targetLabels map[string]string) string {
	l := maps.Clone(s.Labels)
	if l == nil {
		l = map[string]string{}
	}
	maps.Copy(l, targetLabels)
	key := seriesString(s.Name, l)
	sr := r.series[key]
	if sr == nil {
		sr = &series{name: s.Name, labels: l, values: map[int]float64{}, stale: map[int]bool{}}
		r.series[key] = sr
	}
	sr.values[step] = s.Value
	delete(sr.stale, step)
	return key
}

func (r *Recorder) scrape(ctx context.Context, tg Target) ([]Sample, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, tg.URL, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Accept", "text/plain;version=0.0.4")
	resp, err := r.o.Client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		_, _ = io.Copy(io.Discard, resp.Body)
		return nil, fmt.Errorf("%s: %s", tg.URL, resp.Status)
	}
	return ParseText(resp.Body)
}

// ParseText reads Prometheus' text exposition format into samples, one per
// series Prometheus would store (a histogram's _bucket, _sum and _count).
func ParseText(in io.Reader) ([]Sample, error) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(in)
	if err != nil {
		return nil, err
	}
	var out []Sample
	for _, name := range slices.Sorted(maps.Keys(fams)) {
		f := fams[name]
		for _, m := range f.GetMetric() {
			l := map[string]string{}
			for _, lp := range m.GetLabel() {
				l[lp.GetName()] = lp.GetValue()
			}
			out = append(out, familySamples(name, f.GetType(), m, l)...)
		}
	}
	return out, nil
}

func familySamples(name string, typ dto.MetricType, m *dto.Metric, l map[string]string) []Sample {
	switch typ {
	case dto.MetricType_COUNTER:
		return []Sample{{name, l, m.GetCounter().GetValue()}}
	case dto.MetricType_GAUGE:
		return []Sample{{name, l, m.GetGauge().GetValue()}}
	case dto.MetricType_HISTOGRAM:
		h := m.GetHistogram()
		out := []Sample{{name + "_sum", l, h.GetSampleSum()}, {name + "_count", l, float64(h.GetSampleCount())}}
		for _, b := range h.GetBucket() {
			bl := maps.Clone(l)
			bl["le"] = formatFloat(b.GetUpperBound())
			out = append(out, Sample{name + "_bucket", bl, float64(b.GetCumulativeCount())})
		}
		return out
	case dto.MetricType_SUMMARY:
		s := m.GetSummary()
		out := []Sample{{name + "_sum", l, s.GetSampleSum()}, {name + "_count", l, float64(s.GetSampleCount())}}
		for _, q := range s.GetQuantile() {
			ql := maps.Clone(l)
			ql["quantile"] = formatFloat(q.GetQuantile())
			out = append(out, Sample{name, ql, q.GetValue()})
		}
		return out
	default:
		return []Sample{{name, l, m.GetUntyped().GetValue()}}
	}
}

// WaitRound waits until a round that started after t has ended: whatever
// was true at t is then in the recording.
func (r *Recorder) WaitRound(ctx context.Context, t time.Time) error {
	for {
		r.mu.Lock()
		ok := len(r.rounds) > 0 && r.rounds[len(r.rounds)-1].Start.After(t)
		ch := r.roundCh
		r.mu.Unlock()
		if ok {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return fmt.Errorf("waiting for a scrape round after %s: %w", t.Format("15:04:05.000"), ctx.Err())
		}
	}
}

// Rounds returns the rounds so far.
func (r *Recorder) Rounds() []Round {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.rounds)
}

// Check is one assertion about an alert over a window of the run.
type Check struct {
	// Name appears in promtool's output (as the label check="...").
	Name string
	// Alert is the alert's name; "" means every alert but those in Except.
	Alert  string
	Except []string
	// Labels, optional, the firing alert must carry (reason="unknown_kind").
	Labels map[string]string
	// The window: the rounds that started in [From, To].
	From, To time.Time
	// Fires: the alert fired at some evaluation of the window. Otherwise it
	// must fire at none.
	Fires bool
}

// window returns the steps of the first and last rounds that started in
// [From, To].
func (c Check) window(rounds []Round) (from, to int, err error) {
	from, to = -1, -1
	for _, rd := range rounds {
		if rd.Start.Before(c.From) || rd.Start.After(c.To) {
			continue
		}
		if from < 0 {
			from = rd.Step
		}
		to = rd.Step
	}
	if from < 0 {
		return 0, 0, fmt.Errorf("check %q: no scrape round started between %s and %s", c.Name,
			c.From.Format("15:04:05.000"), c.To.Format("15:04:05.000"))
	}
	return from, to, nil
}

func (c Check) expr(width time.Duration) string {
	sel := []string{`alertstate="firing"`}
	if c.Alert != "" {
		sel = append(sel, "alertname="+strconv.Quote(c.Alert))
	}
	if len(c.Except) > 0 {
		sel = append(sel, "alertname!~"+strconv.Quote(strings.Join(c.Except, "|")))
	}
	for _, k := range slices.Sorted(maps.Keys(c.Labels)) {
		sel = append(sel, k+"="+strconv.Quote(c.Labels[k]))
	}
	return fmt.Sprintf(`label_replace(clamp_max(count(max_over_time(ALERTS{%s}[%dms])), 1) or vector(0), "check", %s, "", "")`,
		strings.Join(sel, ","), width.Milliseconds(), strconv.Quote(c.Name))
}

// StripFor turns a PrometheusRule manifest (or a plain rules file) into a
// plain rules file whose alerts have no `for:` (nor keep_firing_for:), and
// returns the alert names.
func StripFor(manifest []byte) ([]byte, []string, error) {
	var doc struct {
		Spec   *struct{ Groups []map[string]any } `json:"spec"`
		Groups []map[string]any                   `json:"groups"`
	}
	if err := yaml.Unmarshal(manifest, &doc); err != nil {
		return nil, nil, fmt.Errorf("rules: %w", err)
	}
	groups := doc.Groups
	if doc.Spec != nil {
		groups = doc.Spec.Groups
	}
	var alerts []string
	for _, g := range groups {
		rules, _ := g["rules"].([]any)
		for _, ru := range rules {
			rule, ok := ru.(map[string]any)
			if !ok {
				continue
			}
			if a, ok := rule["alert"].(string); ok {
				alerts = append(alerts, a)
				delete(rule, "for")
				delete(rule, "keep_firing_for")
			}
		}
	}
	if len(alerts) == 0 {
		return nil, nil, errors.New("rules: no alerts")
	}
	b, err := yaml.Marshal(map[string]any{"groups": groups})
	return b, alerts, err
}

// Promtool finds promtool on PATH.
func Promtool() (string, error) { return exec.LookPath("promtool") }

const (
	rulesFile = "rules-without-for.yaml"
	testFile  = "recorded.test.yaml"
	roundFile = "scrapes.tsv"
)

// Evaluate writes the recording, the rules (as StripFor returns them) and
// the checks into dir and runs `promtool test rules` there. It returns an
// error naming every check that failed, with promtool's output.
func (r *Recorder) Evaluate(ctx context.Context, promtool, dir string, rules []byte, checks []Check) error {
	r.mu.Lock()
	rounds := slices.Clone(r.rounds)
	input := r.inputSeries()
	r.mu.Unlock()
	if len(rounds) == 0 {
		return errors.New("nothing was recorded")
	}
	type sampleExp struct {
		Labels string  `json:"labels"`
		Value  float64 `json:"value"`
	}
	type exprTest struct {
		Expr       string      `json:"expr"`
		EvalTime   string      `json:"eval_time"`
		ExpSamples []sampleExp `json:"exp_samples"`
	}
	var tests []exprTest
	var errs []error
	for _, c := range checks {
		from, to, err := c.window(rounds)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		want := 0.0
		if c.Fires {
			want = 1
		}
		tests = append(tests, exprTest{
			// Half a step past the first: the window holds the
			// evaluations from..to whether the range is closed on the
			// left (Prometheus 2) or open (Prometheus 3).
			Expr:       c.expr(time.Duration(to-from)*r.o.Interval + r.o.Interval/2),
			EvalTime:   fmt.Sprintf("%dms", (time.Duration(to) * r.o.Interval).Milliseconds()),
			ExpSamples: []sampleExp{{Labels: seriesString("", map[string]string{"check": c.Name}), Value: want}},
		})
	}
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	interval := fmt.Sprintf("%dms", r.o.Interval.Milliseconds())
	test := map[string]any{
		"rule_files":          []string{rulesFile},
		"evaluation_interval": interval,
		"tests": []any{map[string]any{
			"name": "recorded run", "interval": interval,
			"input_series": input, "promql_expr_test": tests,
		}},
	}
	b, err := yaml.Marshal(test)
	if err != nil {
		return err
	}
	var tsv strings.Builder
	tsv.WriteString("step\tstart\tduration_ms\tup\tdown\n")
	for _, rd := range rounds {
		fmt.Fprintf(&tsv, "%d\t%s\t%d\t%d\t%s\n", rd.Step, rd.Start.Format(time.RFC3339Nano), rd.Duration.Milliseconds(), rd.Up, strings.Join(rd.Down, "; "))
	}
	for name, content := range map[string][]byte{rulesFile: rules, testFile: b, roundFile: []byte(tsv.String())} {
		if err := os.WriteFile(filepath.Join(dir, name), content, 0o644); err != nil {
			return err
		}
	}
	cmd := exec.CommandContext(ctx, promtool, "test", "rules", testFile)
	cmd.Dir = dir
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("promtool test rules (in %s): %w\n%s", dir, err, out.String())
	}
	if !strings.Contains(out.String(), "SUCCESS") {
		return fmt.Errorf("promtool test rules printed no SUCCESS:\n%s", out.String())
	}
	return nil
}

type inputSeries struct {
	Series string `json:"series"`
	Values string `json:"values"`
}

// inputSeries renders every series in promtool's notation, one value per
// step from 0 to the last round's: a number, `stale`, or `_` (no sample).
func (r *Recorder) inputSeries() []inputSeries {
	last := 0
	for _, rd := range r.rounds {
		last = max(last, rd.Step)
	}
	keys := slices.Sorted(maps.Keys(r.series))
	out := make([]inputSeries, 0, len(keys))
	for _, k := range keys {
		s := r.series[k]
		vals := make([]string, last+1)
		for i := range vals {
			switch v, ok := s.values[i]; {
			case ok:
				vals[i] = formatFloat(v)
			case s.stale[i]:
				vals[i] = "stale"
			default:
				vals[i] = "_"
			}
		}
		out = append(out, inputSeries{Series: k, Values: strings.Join(vals, " ")})
	}
	return out
}

// seriesString writes name{a="x",b="y"} with the labels sorted.
func seriesString(name string, l map[string]string) string {
	keys := slices.Sorted(maps.Keys(l))
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = k + "=" + strconv.Quote(l[k])
	}
	return name + "{" + strings.Join(parts, ",") + "}"
}

func formatFloat(v float64) string {
	switch {
	case math.IsNaN(v):
		return "NaN"
	case math.IsInf(v, 1):
		return "+Inf"
	case math.IsInf(v, -1):
		return "-Inf"
	}
	return strconv.FormatFloat(v, 'g', -1, 64)
}
