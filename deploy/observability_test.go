package deploy

import (
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// prometheusRule is the subset of prometheus-operator's PrometheusRule the
// manifests use, declared here so strict decoding catches a misspelt field
// without importing the operator's module.
type prometheusRule struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
	Spec              struct {
		Groups []struct {
			Name     string `json:"name"`
			Interval string `json:"interval,omitempty"`
			Rules    []struct {
				Alert       string            `json:"alert,omitempty"`
				Record      string            `json:"record,omitempty"`
				Expr        string            `json:"expr"`
				For         string            `json:"for,omitempty"`
				Labels      map[string]string `json:"labels,omitempty"`
				Annotations map[string]string `json:"annotations,omitempty"`
			} `json:"rules"`
		} `json:"groups"`
	} `json:"spec"`
}

// podMonitor is the subset of prometheus-operator's PodMonitor in use.
type podMonitor struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
	Spec              struct {
		Selector            metav1.LabelSelector `json:"selector"`
		PodMetricsEndpoints []struct {
			Port     string `json:"port"`
			Path     string `json:"path,omitempty"`
			Interval string `json:"interval,omitempty"`
		} `json:"podMetricsEndpoints"`
	} `json:"spec"`
}

var (
	metricName   = regexp.MustCompile(`\bidemd_[a-z0-9_]+`)
	labelMatcher = regexp.MustCompile(`\b(outcome|result|reason|cause)=~?"([^"]+)"`)
	objectRef    = regexp.MustCompile(`"(idemd-[a-z-]+)"`)
	heading      = regexp.MustCompile(`(?m)^#{2,4} (.+)$`)
)

// metricsContract returns the metric names listed in docs/operations.md's
// "Metrics" section: the names alerts and dashboards may rely on.
func metricsContract(t *testing.T) map[string]bool {
	t.Helper()
	doc := readFile(t, "../docs/operations.md")
	start := strings.Index(doc, "\n## Metrics\n")
	if start < 0 {
		t.Fatal("docs/operations.md has no \"## Metrics\" section")
	}
	section := doc[start+1:]
	if end := strings.Index(section[3:], "\n## "); end >= 0 {
		section = section[:end+3]
	}
	names := map[string]bool{}
	for _, m := range regexp.MustCompile("`(idemd_[a-z0-9_]+)`").FindAllStringSubmatch(section, -1) {
		names[m[1]] = true
	}
	if len(names) == 0 {
		t.Fatal("the Metrics section of docs/operations.md lists no metrics")
	}
	return names
}

// goSource concatenates the non-test Go files under dir.
func goSource(t *testing.T, dirs ...string) string {
	t.Helper()
	var b strings.Builder
	for _, dir := range dirs {
		err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if !d.IsDir() && strings.HasSuffix(p, ".go") && !strings.HasSuffix(p, "_test.go") {
				b.WriteString(readFile(t, p))
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	return b.String()
}

func readFile(t *testing.T, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// baseMetric maps a histogram's series name to the metric's name.
func baseMetric(name string, contract map[string]bool) string {
	for _, suffix := range []string{"_bucket", "_sum", "_count"} {
		if b, ok := strings.CutSuffix(name, suffix); ok && contract[b] {
			return b
		}
	}
	return name
}

// githubAnchor is the fragment GitHub gives a Markdown heading.
func githubAnchor(h string) string {
	h = strings.ToLower(strings.TrimSpace(h))
	var b strings.Builder
	for _, r := range h {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9', r == '-', r == '_':
			b.WriteRune(r)
		case r == ' ':
			b.WriteByte('-')
		}
	}
	return b.String()
}

// observabilityExprs returns every PromQL expression of the alerts and
// the dashboard, keyed by where it is.
func observabilityExprs(t *testing.T, r *rendered) map[string]string {
	t.Helper()
	exprs := map[string]string{}
	for _, o := range r.byKind("PrometheusRule") {
		for _, g := range o.Obj.(*prometheusRule).Spec.Groups {
			for _, rule := range g.Rules {
				exprs["alert "+rule.Alert+rule.Record] = rule.Expr
			}
		}
	}
	data, ok := r.configData("ConfigMap", "idemd-grafana-dashboard")
	if !ok {
		t.Fatal("no ConfigMap idemd-grafana-dashboard")
	}
	var dash struct {
		UID    string `json:"uid"`
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal([]byte(data["idemd-dashboard.json"]), &dash); err != nil {
		t.Fatalf("grafana dashboard: %v", err)
	}
	if dash.UID == "" {
		t.Error("grafana dashboard has no uid (a re-import would duplicate it)")
	}
	for _, p := range dash.Panels {
		for i, tg := range p.Targets {
			if strings.TrimSpace(tg.Expr) == "" {
				t.Errorf("dashboard panel %q target %d has no expr", p.Title, i)
			}
			exprs[fmt.Sprintf("panel %q #%d", p.Title, i)] = tg.Expr
		}
	}
	return exprs
}

func TestObservability(t *testing.T) {
	r := render(t, "observability")
	base := render(t, "base")
	contract := metricsContract(t)
	docs := readFile(t, "../docs/operations.md")
	anchors := map[string]bool{}
	for _, m := range heading.FindAllStringSubmatch(docs, -1) {
		anchors[githubAnchor(m[1])] = true
	}

	alerts := 0
	for _, o := range r.byKind("PrometheusRule") {
		for _, g := range o.Obj.(*prometheusRule).Spec.Groups {
			for _, rule := range g.Rules {
				if rule.Alert == "" {
					continue
				}
				alerts++
				if s := rule.Labels["severity"]; s != "critical" && s != "warning" && s != "info" {
					t.Errorf("alert %s: severity %q", rule.Alert, s)
				}
				for _, a := range []string{"summary", "description", "runbook_url"} {
					if rule.Annotations[a] == "" {
						t.Errorf("alert %s has no %s annotation", rule.Alert, a)
					}
				}
				checkRunbookURL(t, rule.Alert, rule.Annotations["runbook_url"], anchors)
			}
		}
	}
	if alerts == 0 {
		t.Fatal("no alerts rendered")
	}

	// The package that defines each metric prefix: idemd_<prefix>_...
	pkgs := map[string]string{
		"enqueuer": "enqueuer", "completer": "completer", "reaper": "reaper",
		// The database-wide gauges, exported by one completer replica
		// (internal/dbstats): River's, the vacuum horizon's (db), the
		// exporter's own.
		"river": "dbstats", "db": "dbstats", "dbstats": "dbstats",
		// Every daemon's build and schema versions (internal/daemon).
		"build": "daemon", "schema": "daemon",
		// --database-password-file's reads, on every command.
		"database": "dbcred",
	}
	// Metrics defined elsewhere than their prefix says: the reaper's run
	// history is database-wide, so its last success is exported by
	// internal/dbstats, not by the reaper.
	// The database calls' bounds are every command's (internal/dbcall).
	owners := map[string]string{
		"idemd_reaper_history_last_success_timestamp_seconds": "dbstats",
		"idemd_reaper_history_last_run_throttled_ratio":       "dbstats",
		"idemd_database_call_timeouts_total":                  "dbcall",
		"idemd_database_unanswered":                           "dbcall",
	}
	code := map[string]string{} // by package
	for _, pkg := range append(mapsValues(pkgs), mapsValues(owners)...) {
		if _, ok := code[pkg]; !ok {
			code[pkg] = goSource(t, filepath.Join("..", "internal", pkg))
		}
	}
	// Syntax (PromQL, durations, templates) is promtool's to judge
	// (TestAlertRules); these checks are idemd's own contract.
	for where, expr := range observabilityExprs(t, r) {
		for _, name := range metricName.FindAllString(expr, -1) {
			if !contract[baseMetric(name, contract)] {
				t.Errorf("%s uses %s, which the Metrics section of docs/operations.md does not list", where, name)
			}
		}
		// Label values must be ones the code emits.
		for _, m := range labelMatcher.FindAllStringSubmatch(expr, -1) {
			for _, v := range strings.Split(m[2], "|") {
				if !strings.Contains(strings.Join(mapsValues(code), "\n"), `"`+v+`"`) {
					t.Errorf("%s: %s=%q: no daemon emits the value %q", where, m[1], m[2], v)
				}
			}
		}
		// Names of objects (cronjob="idemd-reaper") must exist.
		for _, m := range objectRef.FindAllStringSubmatch(expr, -1) {
			if !hasObjectNamed(base, m[1]) {
				t.Errorf("%s refers to %q, which the base does not render", where, m[1])
			}
		}
	}
	// The contract matches the code: every listed metric is registered by
	// the daemon its prefix names.
	for name := range contract {
		prefix := strings.SplitN(strings.TrimPrefix(name, "idemd_"), "_", 2)[0]
		pkg, ok := owners[name]
		if !ok {
			if pkg, ok = pkgs[prefix]; !ok {
				t.Errorf("metric %s: no daemon %q", name, prefix)
				continue
			}
		}
		if !strings.Contains(code[pkg], `"`+name+`"`) {
			t.Errorf("metric %s is listed in docs/operations.md but internal/%s does not define it", name, pkg)
		}
	}
	// And every metric the daemons define is documented, and defined once.
	definedBy := map[string]string{}
	for _, pkg := range sortedKeys(code) {
		for _, m := range regexp.MustCompile(`(?:Name:\s*|NewDesc\()"(idemd_[a-z0-9_]+)"`).FindAllStringSubmatch(code[pkg], -1) {
			if !contract[m[1]] {
				t.Errorf("internal/%s defines %s, which docs/operations.md's Metrics section does not list", pkg, m[1])
			}
			if other, ok := definedBy[m[1]]; ok && other != pkg {
				t.Errorf("%s is defined by internal/%s and internal/%s: one owner per metric", m[1], other, pkg)
			}
			definedBy[m[1]] = pkg
		}
	}

	checkPodMonitor(t, r, base)
	checkSelectedByDefault(t, r)
}

// kubePrometheusStack are the labels by which kube-prometheus-stack, at its
// chart's defaults, discovers monitoring objects: its Prometheus selects
// PodMonitors and PrometheusRules labelled with its release name, and its
// Grafana's sidecar loads ConfigMaps labelled grafana_dashboard=1.
var kubePrometheusStack = map[string]map[string]string{
	"PodMonitor":     {"release": "kube-prometheus-stack"},
	"PrometheusRule": {"release": "kube-prometheus-stack"},
	"ConfigMap":      {"grafana_dashboard": "1"},
}

// checkSelectedByDefault: every monitoring object carries the labels
// kube-prometheus-stack selects by default; without them the rules load
// but nothing is scraped, or the dashboard never appears.
func checkSelectedByDefault(t *testing.T, r *rendered) {
	t.Helper()
	for _, kind := range sortedKeys(kubePrometheusStack) {
		objs := r.byKind(kind)
		if len(objs) == 0 {
			t.Errorf("%s: no %s rendered", r.Dir, kind)
		}
		for _, o := range objs {
			got := o.Obj.(metav1.Object).GetLabels()
			for k, v := range kubePrometheusStack[kind] {
				if got[k] != v {
					t.Errorf("%s: %s has label %s=%q, want %q (kube-prometheus-stack's default selector)", r.Dir, o, k, got[k], v)
				}
			}
		}
	}
}

func checkPodMonitor(t *testing.T, r, base *rendered) {
	t.Helper()
	pms := r.byKind("PodMonitor")
	if len(pms) == 0 {
		t.Fatal("no PodMonitor")
	}
	for _, name := range daemons {
		o, ok := base.find("Deployment", "idemd-"+name)
		if !ok {
			continue
		}
		d := o.Obj.(*appsv1.Deployment)
		scraped := false
		for _, p := range pms {
			pm := p.Obj.(*podMonitor)
			sel, err := metav1.LabelSelectorAsSelector(&pm.Spec.Selector)
			if err != nil {
				t.Fatalf("%s: %v", p, err)
			}
			if !sel.Matches(labels.Set(d.Spec.Template.Labels)) {
				continue
			}
			for _, ep := range pm.Spec.PodMetricsEndpoints {
				c := container(d.Spec.Template.Spec.Containers, name)
				if c != nil && resolvePort(c, intstr.FromString(ep.Port)) != "unresolved:"+ep.Port && (ep.Path == "" || ep.Path == "/metrics") {
					scraped = true
				}
			}
		}
		if !scraped {
			t.Errorf("%s: no PodMonitor scrapes its metrics port", o)
		}
	}
}

func hasObjectNamed(r *rendered, name string) bool {
	for _, o := range r.Objects {
		if o.Name == name {
			return true
		}
	}
	return false
}

func mapsValues(m map[string]string) []string {
	out := make([]string, 0, len(m))
	for _, k := range sortedKeys(m) {
		out = append(out, m[k])
	}
	return out
}

// runbookBase is where the docs are published: runbook_url must be an
// absolute https URL (Alertmanager and Grafana render it as a link; a
// repository-relative path leads nowhere from a pager).
const runbookBase = "https://github.com/idemd/idemd/blob/main/docs/operations.md#"

// checkRunbookURL: an alert's runbook_url is the docs' section named after
// the alert, and that section exists.
func checkRunbookURL(t reporter, alert, url string, anchors map[string]bool) {
	t.Helper()
	anchor, ok := strings.CutPrefix(url, runbookBase)
	switch {
	case !ok:
		t.Errorf("alert %s: runbook_url %q does not start with %s", alert, url, runbookBase)
	case anchor != strings.ToLower(alert):
		t.Errorf("alert %s: runbook_url anchor %q, want %q (the section named after the alert)", alert, anchor, strings.ToLower(alert))
	case !anchors[anchor]:
		t.Errorf("alert %s: docs/operations.md has no \"### %s\" section for runbook_url %s", alert, alert, url)
	}
}

// TestRunbookURLCheck: the check catches a relative link, a link to
// another section and a section that does not exist.
func TestRunbookURLCheck(t *testing.T) {
	anchors := map[string]bool{"idemdup": true, "idemdother": true}
	for url, want := range map[string]string{
		runbookBase + "idemdup":         "",
		"docs/operations.md#idemdup":    "does not start with",
		runbookBase + "idemdother":      "want \"idemdup\"",
		runbookBase + "idemdup-missing": "want \"idemdup\"",
	} {
		ft := &fakeT{}
		checkRunbookURL(ft, "IdemdUp", url, anchors)
		if want == "" && len(ft.errors) > 0 || want != "" && !ft.logged(regexp.QuoteMeta(want)) {
			t.Errorf("%s: reported %q, want %q", url, ft.errors, want)
		}
	}
	ft := &fakeT{}
	checkRunbookURL(ft, "IdemdGone", runbookBase+"idemdgone", anchors)
	if !ft.logged("has no .### IdemdGone. section") {
		t.Errorf("a missing section: reported %q", ft.errors)
	}
}
