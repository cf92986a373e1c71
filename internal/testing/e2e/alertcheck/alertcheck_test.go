package alertcheck

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// promtool returns promtool's path: a developer's machine may skip, CI must
// not (scripts/ensure-promtool.sh installs it).
func promtool(t *testing.T) string {
	t.Helper()
	p, err := Promtool()
	if err == nil {
		return p
	}
	if os.Getenv("CI") == "true" {
		t.Fatalf("promtool is not on PATH and CI=true: scripts/ensure-promtool.sh installs it (%v)", err)
	}
	t.Skipf("promtool is not on PATH: run scripts/ensure-promtool.sh (%v)", err)
	return ""
}

// exporter serves whatever text it is given, or a 500 when down.
type exporter struct {
	mu   sync.Mutex
	text string
	down bool
}

func (e *exporter) set(text string, down bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.text, e.down = text, down
}

func (e *exporter) ServeHTTP(w http.ResponseWriter, _ *http.Request) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.down {
		http.Error(w, "down", http.StatusInternalServerError)
		return
	}
	fmt.Fprint(w, e.text)
}

const testRules = `
apiVersion: monitoring.coreos.com/v1
kind: PrometheusRule
metadata: {name: t}
spec:
  groups:
    - name: t
      rules:
        - alert: DeadLettered
          expr: sum by (reason) (increase(t_dead_total[15m])) > 0
          for: 1h
        - alert: TargetDown
          expr: max by (pod) (up) == 0
          for: 10m
        - record: t:ignored
          expr: vector(1)
`

const exposition = `# HELP t_dead_total Dead rows.
# TYPE t_dead_total counter
t_dead_total{reason="unknown_kind"} %d
t_dead_total{reason="invalid_queue"} 0
# HELP t_latency_seconds Latency.
# TYPE t_latency_seconds histogram
t_latency_seconds_bucket{le="0.1"} 1
t_latency_seconds_bucket{le="+Inf"} 2
t_latency_seconds_sum 0.3
t_latency_seconds_count 2
`

// TestRecordedRunEvaluates records a made-up run round by round (a dead
// row at round 3, the target down at round 5) and checks that promtool
// sees the alerts fire where they should, stays silent where they should
// not, and that a wrong expectation fails: the check can fail.
func TestRecordedRunEvaluates(t *testing.T) {
	bin := promtool(t)
	ex := &exporter{}
	srv := httptest.NewServer(ex)
	defer srv.Close()
	origin := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	r := NewRecorder(Options{
		Interval: time.Second,
		Targets:  []Target{{URL: srv.URL, Labels: map[string]string{"pod": "p-1"}}},
		Keep:     func(name string) bool { return name != "t_latency_seconds_bucket" },
		Probe: func(context.Context) []Sample {
			return []Sample{{Name: "probe_value", Labels: map[string]string{"k": "v"}, Value: 7}}
		},
	}, origin)
	defer r.Stop()
	ctx := context.Background()
	at := func(i int) time.Time { return origin.Add(time.Duration(i)*time.Second + 7*time.Millisecond) }
	for i := range 8 {
		dead := 0
		if i >= 3 {
			dead = 1
		}
		ex.set(fmt.Sprintf(exposition, dead), i == 5)
		r.Scrape(ctx, at(i))
	}
	if got := len(r.Rounds()); got != 8 {
		t.Fatalf("%d rounds, want 8", got)
	}

	rules, alerts, err := StripFor([]byte(testRules))
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(rules), "for:") {
		t.Errorf("StripFor left a for:\n%s", rules)
	}
	if fmt.Sprint(alerts) != "[DeadLettered TargetDown]" {
		t.Errorf("alerts %v", alerts)
	}

	input := r.inputSeries()
	byName := map[string]string{}
	for _, s := range input {
		byName[s.Series] = s.Values
	}
	for series, want := range map[string]string{
		`t_dead_total{pod="p-1",reason="unknown_kind"}`: "0 0 0 1 1 stale 1 1",
		`up{pod="p-1"}`:                      "1 1 1 1 1 0 1 1",
		`t_latency_seconds_count{pod="p-1"}`: "2 2 2 2 2 stale 2 2",
		`probe_value{k="v"}`:                 "7 7 7 7 7 7 7 7",
	} {
		if got := byName[series]; got != want {
			t.Errorf("%s: values %q, want %q (all: %v)", series, got, want, byName)
		}
	}
	if _, ok := byName[`t_latency_seconds_bucket{le="+Inf",pod="p-1"}`]; ok {
		t.Error("a series Keep refused was recorded")
	}

	w := func(from, to int) (time.Time, time.Time) { return at(from), at(to) }
	check := func(name, alert string, labels map[string]string, from, to int, fires bool) Check {
		f, tt := w(from, to)
		return Check{Name: name, Alert: alert, Labels: labels, From: f, To: tt, Fires: fires}
	}
	good := []Check{
		check("healthy start", "", nil, 0, 2, false),
		check("dead row", "DeadLettered", map[string]string{"reason": "unknown_kind"}, 3, 4, true),
		check("other reason silent", "DeadLettered", map[string]string{"reason": "invalid_queue"}, 0, 7, false),
		check("target down", "TargetDown", map[string]string{"pod": "p-1"}, 5, 5, true),
		check("target back", "TargetDown", nil, 6, 7, false),
		{Name: "all but the dead row", Except: []string{"DeadLettered"}, From: at(3), To: at(4)},
	}
	if err := r.Evaluate(ctx, bin, t.TempDir(), rules, good); err != nil {
		t.Fatal(err)
	}

	// Wrong expectations fail, and say which check.
	for _, bad := range []Check{
		check("dead row before it happened", "DeadLettered", nil, 0, 2, true),
		check("down while up", "TargetDown", nil, 6, 7, true),
		check("no alert ever", "", nil, 0, 7, false),
		{Name: "all but the dead row, target down", Except: []string{"DeadLettered"}, From: at(3), To: at(5)},
	} {
		err := r.Evaluate(ctx, bin, t.TempDir(), rules, []Check{bad})
		if err == nil || !strings.Contains(err.Error(), bad.Name) {
			t.Errorf("check %q: Evaluate returned %v, want a failure naming it", bad.Name, err)
		}
	}
	f, tt := w(20, 30)
	if err := r.Evaluate(ctx, bin, t.TempDir(), rules, []Check{{Name: "after the run", From: f, To: tt}}); err == nil || !strings.Contains(err.Error(), "no scrape round") {
		t.Errorf("a window without rounds: %v", err)
	}
}

// TestRecorderRunsRounds: Start scrapes on its own, WaitRound returns once
// a round after the given time has ended, and a target that is gone is
// recorded down.
func TestRecorderRunsRounds(t *testing.T) {
	ex := &exporter{}
	ex.set(fmt.Sprintf(exposition, 0), false)
	srv := httptest.NewServer(ex)
	gone := httptest.NewServer(http.NotFoundHandler())
	gone.Close()
	defer srv.Close()
	r := NewRecorder(Options{Interval: 20 * time.Millisecond, Targets: []Target{
		{URL: srv.URL, Labels: map[string]string{"pod": "a"}},
		{URL: gone.URL, Labels: map[string]string{"pod": "b"}},
	}}, time.Now())
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	r.Start(ctx)
	mark := time.Now()
	if err := r.WaitRound(ctx, mark); err != nil {
		t.Fatal(err)
	}
	r.Stop()
	rounds := r.Rounds()
	last := rounds[len(rounds)-1]
	if !last.Start.After(mark) {
		t.Errorf("WaitRound returned before a round after %s ended: %+v", mark, last)
	}
	if last.Up != 1 || len(last.Down) != 1 || !strings.Contains(last.Down[0], "b") {
		t.Errorf("round %+v: want a up, b down", last)
	}
}

func TestParseText(t *testing.T) {
	s, err := ParseText(strings.NewReader(fmt.Sprintf(exposition, 4)))
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, x := range s {
		got = append(got, fmt.Sprintf("%s %v", seriesString(x.Name, x.Labels), x.Value))
	}
	want := []string{
		`t_dead_total{reason="unknown_kind"} 4`, `t_dead_total{reason="invalid_queue"} 0`,
		`t_latency_seconds_sum{} 0.3`, `t_latency_seconds_count{} 2`,
		`t_latency_seconds_bucket{le="0.1"} 1`, `t_latency_seconds_bucket{le="+Inf"} 2`,
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("parsed:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}
