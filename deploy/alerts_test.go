package deploy

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// The alerts are checked and unit-tested by Prometheus' own promtool, not by
// a PromQL reading of our own: `promtool check rules` parses every
// expression, duration and template, and `promtool test rules` evaluates the
// rules over the series written in deploy/observability/tests/*.test.yaml
// and compares the alerts that fire. The PrometheusRule is a Kubernetes
// object, so its spec.groups are written out as a plain rules file first,
// under the name the test files load.
const (
	alertTestsDir = "observability/tests"
	rulesFileName = "idemd-rules.yaml"
	// alertTestDirEnv keeps the generated files in a directory of one's
	// choosing, to run promtool by hand (docs/operations.md).
	alertTestDirEnv = "IDEMD_ALERT_TEST_DIR"
)

// promtoolTestFile is the subset of promtool's unit-test format the tests
// use, decoded strictly so a misspelt key (exp_alert) fails here instead of
// silently testing nothing.
type promtoolTestFile struct {
	RuleFiles          []string `json:"rule_files"`
	EvaluationInterval string   `json:"evaluation_interval,omitempty"`
	Tests              []struct {
		Name        string `json:"name"`
		Interval    string `json:"interval,omitempty"`
		InputSeries []struct {
			Series string `json:"series"`
			Values string `json:"values"`
		} `json:"input_series"`
		AlertRuleTests []struct {
			EvalTime  string `json:"eval_time"`
			Alertname string `json:"alertname"`
			ExpAlerts []struct {
				ExpLabels      map[string]string `json:"exp_labels,omitempty"`
				ExpAnnotations map[string]string `json:"exp_annotations,omitempty"`
			} `json:"exp_alerts"`
		} `json:"alert_rule_test"`
	} `json:"tests"`
}

// promtool returns the path of promtool. Without it the alert tests cannot
// run: CI must not pass without them, a developer's machine may skip.
func promtool(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("promtool")
	if err == nil {
		return p
	}
	if os.Getenv("CI") == "true" {
		t.Fatalf("promtool is not on PATH and CI=true: scripts/ensure-promtool.sh installs it (%v)", err)
	}
	t.Skipf("promtool is not on PATH: run scripts/ensure-promtool.sh (Debian's prometheus package) to test the alerts (%v)", err)
	return ""
}

// runPromtool runs promtool with args in dir and fails the test with its
// output when it exits non-zero.
func runPromtool(t *testing.T, bin, dir string, args ...string) string {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Dir = dir
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		t.Errorf("promtool %s (in %s): %v\n%s", strings.Join(args, " "), dir, err, out.String())
	}
	return out.String()
}

// alertTestDir is where the generated rules and the copied test files go:
// a fresh temporary directory, or $IDEMD_ALERT_TEST_DIR to keep them.
func alertTestDir(t *testing.T) string {
	t.Helper()
	dir := os.Getenv(alertTestDirEnv)
	if dir == "" {
		return t.TempDir()
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatalf("create %s: %v", dir, err)
	}
	t.Logf("alert rules and tests kept in %s", dir)
	return dir
}

// writeRulesFile writes the groups of every rendered PrometheusRule as one
// plain Prometheus rules file (what the operator hands Prometheus) and
// returns the alert names.
func writeRulesFile(t *testing.T, r *rendered, path string) []string {
	t.Helper()
	var groups []any
	var alerts []string
	for _, o := range r.byKind("PrometheusRule") {
		spec := o.Obj.(*prometheusRule).Spec
		for _, g := range spec.Groups {
			groups = append(groups, g)
			for _, rule := range g.Rules {
				if rule.Alert != "" {
					alerts = append(alerts, rule.Alert)
				}
			}
		}
	}
	if len(alerts) == 0 {
		t.Fatal("the rendered observability kustomization has no alerts")
	}
	b, err := yaml.Marshal(map[string]any{"groups": groups})
	if err != nil {
		t.Fatalf("marshal rules: %v", err)
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatalf("write rules: %v", err)
	}
	return alerts
}

// dashboardVars are values for the Grafana variables in the dashboard's
// queries, so that promtool can parse them.
var dashboardVars = strings.NewReplacer("$__rate_interval", "5m", "$namespace", "idemd")

// writeDashboardRules writes every dashboard query as a recording rule:
// `promtool check rules` then parses them like the alerts.
func writeDashboardRules(t *testing.T, r *rendered, path string) {
	t.Helper()
	var rules []map[string]string
	exprs := observabilityExprs(t, r)
	for _, where := range sortedKeys(exprs) {
		if !strings.HasPrefix(where, "panel ") {
			continue
		}
		rules = append(rules, map[string]string{
			"record": fmt.Sprintf("idemd_dashboard:query%d", len(rules)),
			"expr":   dashboardVars.Replace(exprs[where]),
		})
	}
	if len(rules) == 0 {
		t.Fatal("the dashboard has no queries")
	}
	b, err := yaml.Marshal(map[string]any{"groups": []any{map[string]any{"name": "dashboard", "rules": rules}}})
	if err != nil {
		t.Fatalf("marshal dashboard rules: %v", err)
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatalf("write dashboard rules: %v", err)
	}
}

// TestAlertRules: promtool accepts the alerts and the dashboard's queries,
// every alert has a case in which it fires and one in which it must stay
// silent, and every case passes.
func TestAlertRules(t *testing.T) {
	bin := promtool(t)
	r := render(t, "observability")
	dir := alertTestDir(t)

	alerts := writeRulesFile(t, r, filepath.Join(dir, rulesFileName))
	writeDashboardRules(t, r, filepath.Join(dir, "dashboard-queries.yaml"))
	runPromtool(t, bin, dir, "check", "rules", rulesFileName, "dashboard-queries.yaml")

	testFiles, cases := loadAlertTests(t, dir)
	checkAlertCoverage(t, alerts, cases)
	if t.Failed() {
		return
	}
	out := runPromtool(t, bin, dir, append([]string{"test", "rules"}, testFiles...)...)
	if !t.Failed() && !strings.Contains(out, "SUCCESS") {
		t.Errorf("promtool test rules printed no SUCCESS:\n%s", out)
	}
}

// alertCases counts, per alert name, the cases expecting it to fire and the
// cases expecting it silent.
type alertCases map[string]*struct{ firing, silent []string }

func (c alertCases) add(alert, where string, fires bool) {
	if c[alert] == nil {
		c[alert] = &struct{ firing, silent []string }{}
	}
	if fires {
		c[alert].firing = append(c[alert].firing, where)
	} else {
		c[alert].silent = append(c[alert].silent, where)
	}
}

// loadAlertTests copies the test files into dir (next to the generated
// rules file) and returns their names and what they cover.
func loadAlertTests(t *testing.T, dir string) ([]string, alertCases) {
	t.Helper()
	paths, err := filepath.Glob(filepath.Join(alertTestsDir, "*.test.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if len(paths) == 0 {
		t.Fatalf("no %s/*.test.yaml", alertTestsDir)
	}
	sort.Strings(paths)
	cases := alertCases{}
	var names []string
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		var f promtoolTestFile
		if err := yaml.UnmarshalStrict(b, &f); err != nil {
			t.Errorf("%s: %v", p, err)
			continue
		}
		if len(f.RuleFiles) != 1 || f.RuleFiles[0] != rulesFileName {
			t.Errorf("%s: rule_files %v, want [%s] (the file this test generates from prometheusrule.yaml)", p, f.RuleFiles, rulesFileName)
		}
		for i, tc := range f.Tests {
			if tc.Name == "" {
				t.Errorf("%s: test #%d has no name", p, i)
			}
			if len(tc.AlertRuleTests) == 0 {
				t.Errorf("%s: test %q checks no alert", p, tc.Name)
			}
			for _, at := range tc.AlertRuleTests {
				cases.add(at.Alertname, fmt.Sprintf("%s: %q at %s", filepath.Base(p), tc.Name, at.EvalTime), len(at.ExpAlerts) > 0)
			}
		}
		name := filepath.Base(p)
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
		names = append(names, name)
	}
	return names, cases
}

// checkAlertCoverage: an alert without a firing case may never fire (the
// dead-letter alert did not, on a reason's first row); one without a silent
// case may always fire (the reaper alert did, after each restart). A case
// naming an alert that does not exist would pass vacuously: promtool expects
// no alerts from an unknown name and finds none.
func checkAlertCoverage(t reporter, alerts []string, cases alertCases) {
	t.Helper()
	known := map[string]bool{}
	for _, a := range alerts {
		known[a] = true
		c := cases[a]
		if c == nil || len(c.firing) == 0 {
			t.Errorf("alert %s has no case in %s where it fires (an alert_rule_test with exp_alerts)", a, alertTestsDir)
		}
		if c == nil || len(c.silent) == 0 {
			t.Errorf("alert %s has no case in %s where it must stay silent (an alert_rule_test with exp_alerts: [])", a, alertTestsDir)
		}
	}
	for _, a := range sortedKeys(cases) {
		if !known[a] {
			t.Errorf("%s tests alert %s, which prometheusrule.yaml does not define (%v)", alertTestsDir, a, append(cases[a].firing, cases[a].silent...))
		}
	}
}

// TestAlertCoverageCheck: the coverage check itself catches an alert
// without a firing case, one without a silent case, and a case for an alert
// that does not exist.
func TestAlertCoverageCheck(t *testing.T) {
	cases := alertCases{}
	cases.add("Both", "a", true)
	cases.add("Both", "b", false)
	cases.add("OnlyFires", "c", true)
	cases.add("OnlySilent", "d", false)
	cases.add("Ghost", "e", true)
	ft := &fakeT{}
	checkAlertCoverage(ft, []string{"Both", "OnlyFires", "OnlySilent", "Missing"}, cases)
	want := []string{
		`alert OnlyFires has no case .* stay silent`,
		`alert OnlySilent has no case .* fires`,
		`alert Missing has no case .* fires`,
		`alert Missing has no case .* stay silent`,
		`tests alert Ghost, which prometheusrule.yaml does not define`,
	}
	for _, w := range want {
		if !ft.logged(w) {
			t.Errorf("coverage check did not report %q; it reported %q", w, ft.errors)
		}
	}
	if len(ft.errors) != len(want) {
		t.Errorf("coverage check reported %d problems, want %d: %q", len(ft.errors), len(want), ft.errors)
	}
}

// reporter is the part of *testing.T the coverage check uses, so its own
// test can record what it reports.
type reporter interface {
	Helper()
	Errorf(format string, args ...any)
}

type fakeT struct{ errors []string }

func (f *fakeT) Helper() {}

func (f *fakeT) Errorf(format string, args ...any) {
	f.errors = append(f.errors, fmt.Sprintf(format, args...))
}

func (f *fakeT) logged(pattern string) bool {
	re := regexp.MustCompile(pattern)
	for _, e := range f.errors {
		if re.MatchString(e) {
			return true
		}
	}
	return false
}
