//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/idemd/idemd/internal/testing/e2e/alertcheck"
	"github.com/idemd/idemd/internal/testing/e2e/system"
)

// The alerts are checked against the run (docs/e2e.md, "Alerts"): the
// recorder scrapes every daemon's /metrics once a second, as Prometheus
// would, and promtool evaluates deploy/observability's alerts over what it
// saw, without their `for:`.
const (
	scrapeInterval = time.Second
	// healthyRounds scrapes of the running system, before any fault, in
	// which no alert may fire.
	healthyRounds = 5
	// alertNamespace is the namespace label of every recorded series.
	alertNamespace = "idemd-e2e"
	// alertDirEnv keeps the recording, the rules and promtool's test file
	// in a directory of one's choosing (the test's own is removed).
	alertDirEnv = "IDEMD_E2E_ALERT_DIR"
	rulesPath   = "deploy/observability/prometheusrule.yaml"
)

// healthyExceptions are alerts left out of the healthy-start check because
// of a known defect, each until it is fixed. None: every alert stays quiet
// on a healthy start.
var healthyExceptions []string

// alertRun is the recording of one run and the moments of its faults.
type alertRun struct {
	rec      *alertcheck.Recorder
	rules    []byte // the alerts without for:
	promtool string // "" when missing (outside CI): the evaluation is skipped

	mu            sync.Mutex
	marks         map[string]time.Time
	poisonReasons []string // the reason codes the poison rows got
}

// mark records when something happened; the first time counts.
func (a *alertRun) mark(name string) time.Time {
	now := time.Now()
	a.mu.Lock()
	defer a.mu.Unlock()
	if _, ok := a.marks[name]; !ok {
		a.marks[name] = now
	}
	return now
}

func (a *alertRun) at(name string) (time.Time, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	t, ok := a.marks[name]
	return t, ok
}

// startRecording checks that promtool is there (CI=true fails without it)
// and starts scraping every daemon.
func (e *env) startRecording(ctx context.Context) {
	t := e.t
	a := &alertRun{marks: map[string]time.Time{}}
	e.alerts = a
	bin, err := alertcheck.Promtool()
	switch {
	case err == nil:
		a.promtool = bin
	case os.Getenv("CI") == "true":
		t.Fatalf("promtool is not on PATH and CI=true: scripts/ensure-promtool.sh installs it (%v)", err)
	default:
		t.Logf("promtool is not on PATH (%v): the alerts are not checked against this run; scripts/ensure-promtool.sh installs it", err)
	}
	root, err := system.ModuleRoot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	manifest, err := os.ReadFile(filepath.Join(root, rulesPath))
	if err != nil {
		t.Fatal(err)
	}
	if a.rules, _, err = alertcheck.StripFor(manifest); err != nil {
		t.Fatal(err)
	}
	// Only the series the rules read are kept.
	used := map[string]bool{}
	for _, w := range regexp.MustCompile(`[a-zA-Z_:][a-zA-Z0-9_:]*`).FindAllString(string(a.rules), -1) {
		used[w] = true
	}
	var targets []alertcheck.Target
	for _, p := range e.daemons.All() {
		targets = append(targets, alertcheck.Target{
			URL:    "http://" + p.OpsAddr + "/metrics",
			Labels: map[string]string{"namespace": alertNamespace, "pod": p.Name, "container": container(p)},
		})
	}
	a.rec = alertcheck.NewRecorder(alertcheck.Options{
		Interval: scrapeInterval,
		Targets:  targets,
		Keep:     func(name string) bool { return used[name] },
		Probe:    e.deploymentAvailability,
	}, time.Now())
	a.mark("recording")
	a.rec.Start(ctx)
	t.Cleanup(a.rec.Stop)
}

// alertNames lists the alerts of rules, in order.
func alertNames(rules []byte) []string {
	var names []string
	for _, m := range regexp.MustCompile(`(?m)^\s*- alert: (\S+)`).FindAllSubmatch(rules, -1) {
		names = append(names, string(m[1]))
	}
	return names
}

// container is the container name a daemon would have in its pod.
func container(p *system.Proc) string {
	name, _, _ := strings.Cut(p.Name, "-")
	return name
}

// deploymentAvailability plays kube-state-metrics for the Deployments'
// alerts: each round, a daemon counts as an available replica when its
// /readyz answers 200 within the round, as the kubelet's readiness probe
// would decide.
func (e *env) deploymentAvailability(ctx context.Context) []alertcheck.Sample {
	ctx, cancel := context.WithTimeout(ctx, scrapeInterval*8/10)
	defer cancel()
	var out []alertcheck.Sample
	for _, d := range []struct {
		name  string
		procs []*system.Proc
	}{{"idemd-enqueuer", e.daemons.Enqueuers}, {"idemd-completer", e.daemons.Completers}} {
		ready := make([]bool, len(d.procs))
		var wg sync.WaitGroup
		for i, p := range d.procs {
			wg.Add(1)
			go func() { defer wg.Done(); ready[i], _ = p.Ready(ctx) }()
		}
		wg.Wait()
		n := 0
		for _, r := range ready {
			if r {
				n++
			}
		}
		l := map[string]string{"namespace": alertNamespace, "deployment": d.name}
		out = append(out,
			alertcheck.Sample{Name: "kube_deployment_spec_replicas", Labels: l, Value: float64(len(d.procs))},
			alertcheck.Sample{Name: "kube_deployment_status_replicas_available", Labels: l, Value: float64(n)})
	}
	return out
}

// healthyStart lets the recorder scrape the running system, traffic and
// all, before the first fault.
func (e *env) healthyStart(ctx context.Context) {
	a := e.alerts
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	for range healthyRounds {
		if err := a.rec.WaitRound(wctx, time.Now()); err != nil {
			e.t.Fatal(err)
		}
	}
	a.mark("healthy end")
	e.logf("alerts: %d scrapes of the healthy system recorded", len(a.rec.Rounds()))
}

// scraped waits until a scrape round that started after now has ended, so
// that what is true now is in the recording. The caller holds off the
// killer meanwhile when a restart would lose what it waits for (a counter
// that a SIGKILL resets before anyone scraped it).
func (e *env) scraped(ctx context.Context, what string) {
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := e.alerts.rec.WaitRound(wctx, time.Now()); err != nil {
		e.t.Errorf("%s: %v", what, err)
	}
}

// counted waits until the daemons procs, summed, show the counter name
// with labels at 1 or more on their own /metrics pages. A batch or a
// replay bumps its counter after the effect the caller waited for (the
// commit, the API's answer), so a scrape right after that effect can
// still read the old value; the caller holds off the killer, so once a
// page shows the count the next scrape round sees it too.
func (e *env) counted(ctx context.Context, procs []*system.Proc, name string, labels map[string]string) {
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	var sum float64
	err := system.Poll(wctx, 50*time.Millisecond, func() (bool, error) {
		sum = 0
		for _, p := range procs {
			samples, err := metricSamples(wctx, p)
			if errors.Is(err, errNoPage) {
				return false, nil // a daemon between lives; the next poll asks again
			}
			if err != nil {
				return false, err
			}
			for _, s := range samples {
				if s.Name == name && labelsMatch(s.Labels, labels) {
					sum += s.Value
				}
			}
		}
		return sum >= 1, nil
	})
	if err != nil {
		e.t.Errorf("%s%v never counted on the daemons' /metrics (sum %v): %v", name, labels, sum, err)
	}
}

// errNoPage: a daemon's /metrics did not answer.
var errNoPage = errors.New("no /metrics page")

// metricSamples reads p's /metrics page, parsed as the recorder parses it.
func metricSamples(ctx context.Context, p *system.Proc) ([]alertcheck.Sample, error) {
	page, err := p.Metrics(ctx)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", errNoPage, err)
	}
	return alertcheck.ParseText(bytes.NewReader(page))
}

// labelsMatch reports whether have carries every label of want.
func labelsMatch(have, want map[string]string) bool {
	for k, v := range want {
		if have[k] != v {
			return false
		}
	}
	return true
}

// checkAlerts stops the recording and has promtool evaluate the alerts over
// it: silent during the healthy start, and for every fault the alert that
// covers it fired while it lasted.
func (e *env) checkAlerts(ctx context.Context) {
	t, a := e.t, e.alerts
	a.rec.Stop()
	end := a.mark("recording end")
	rounds := a.rec.Rounds()
	down := 0
	for _, r := range rounds {
		down += len(r.Down)
	}
	e.logf("alerts: %d scrape rounds, %d failed scrapes (a daemon down)", len(rounds), down)

	m := func(name string) time.Time {
		tm, ok := a.at(name)
		if !ok {
			t.Errorf("alerts: the run never marked %q", name)
		}
		return tm
	}
	checks := []alertcheck.Check{
		{Name: "healthy start: no alert", Except: healthyExceptions, From: m("recording"), To: m("healthy end")},
		{Name: "SIGKILLed daemons: IdemdMetricsDown", Alert: "IdemdMetricsDown", From: m("killer start"), To: m("killer stop"), Fires: true},
		{Name: "PostgreSQL outage: IdemdDaemonDown (enqueuer)", Alert: "IdemdDaemonDown", Labels: map[string]string{"deployment": "idemd-enqueuer"},
			From: m("outage start"), To: m("outage end"), Fires: true},
		{Name: "PostgreSQL outage: IdemdDaemonDown (completer)", Alert: "IdemdDaemonDown", Labels: map[string]string{"deployment": "idemd-completer"},
			From: m("outage start"), To: m("outage end"), Fires: true},
		{Name: "PostgreSQL outage: IdemdEnqueuerListenerDown", Alert: "IdemdEnqueuerListenerDown",
			From: m("outage start"), To: m("outage end"), Fires: true},
		{Name: "signer clock skew: IdemdCompleterUnauthorized", Alert: "IdemdCompleterUnauthorized", From: m("skew start"), To: end, Fires: true},
	}
	// The same window alert by alert, so that a failure names the alert
	// that fired (promtool reports only which check failed).
	for _, name := range alertNames(a.rules) {
		if slices.Contains(healthyExceptions, name) {
			continue
		}
		checks = append(checks, alertcheck.Check{Name: "healthy start: no " + name, Alert: name, From: m("recording"), To: m("healthy end")})
	}
	a.mu.Lock()
	reasons := a.poisonReasons
	a.mu.Unlock()
	if len(reasons) == 0 {
		t.Error("alerts: no reason of the poison rows was recorded")
	}
	for _, r := range reasons {
		checks = append(checks, alertcheck.Check{Name: "poison row: IdemdJobsDeadLettered " + r, Alert: "IdemdJobsDeadLettered",
			Labels: map[string]string{"reason": r}, From: m("poison"), To: end, Fires: true})
	}
	for _, c := range checks {
		verb := "fires"
		if !c.Fires {
			verb = "silent"
		}
		e.logf("alerts: %s (%s, %s to %s)", c.Name, verb, c.From.Format("15:04:05.000"), c.To.Format("15:04:05.000"))
	}
	if t.Failed() || a.promtool == "" {
		return
	}
	dir := filepath.Join(e.dir, "alerts")
	if d := os.Getenv(alertDirEnv); d != "" {
		dir = filepath.Join(d, strings.ReplaceAll(t.Name(), "/", "_"))
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := a.rec.Evaluate(ctx, a.promtool, dir, a.rules, checks); err != nil {
		t.Errorf("alerts over the recorded run: %v\n(%s keeps the recording)", err, alertDirEnv)
		return
	}
	e.logf("alerts: promtool agrees on all %d checks (%s)", len(checks), dir)
}

// poisonReasons reads the reason codes the enqueuers gave the poison rows
// once all of them are dead-lettered, records them for checkAlerts and
// returns them.
func (e *env) poisonReasons(ctx context.Context) ([]string, error) {
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	var reasons []string
	err := system.Poll(wctx, 50*time.Millisecond, func() (bool, error) {
		var n int
		err := e.pool.QueryRow(wctx, `SELECT count(*), coalesce(array_agg(DISTINCT split_part(reason, ':', 1)), '{}')
			FROM staged_jobs_dead WHERE id = ANY($1)`, e.poison).Scan(&n, &reasons)
		return n == len(e.poison), err
	})
	if err != nil {
		return nil, fmt.Errorf("poison rows not all dead-lettered: %w", err)
	}
	e.alerts.mu.Lock()
	e.alerts.poisonReasons = reasons
	e.alerts.mu.Unlock()
	return reasons, nil
}
