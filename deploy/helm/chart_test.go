// Package helm holds the tests of idemd's Helm chart (deploy/helm/idemd):
// it is rendered with Helm's own Go library, as `helm template` and `helm
// install` would, linted with Helm's linter, and compared with the
// kustomize base (deploy/base), so that the two renderings cannot drift
// apart silently. It is a module of its own: Helm's library brings
// Kubernetes' client libraries, which the idem package's users must not
// inherit through the main go.mod.
package helm

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"helm.sh/helm/v4/pkg/action"
	"helm.sh/helm/v4/pkg/chart/common"
	"helm.sh/helm/v4/pkg/chart/v2/lint"
	"helm.sh/helm/v4/pkg/chart/v2/lint/support"
	"helm.sh/helm/v4/pkg/chart/v2/loader"
	release "helm.sh/helm/v4/pkg/release/v1"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	"sigs.k8s.io/yaml"
)

const (
	chartDir  = "idemd"
	namespace = "idemd"
	// kubeVersion is the oldest Kubernetes the chart's kubeVersion admits.
	kubeVersion = "v1.30.0"
)

// object is one rendered manifest: its kind, name, the raw document and,
// for the kinds the comparison reads, the typed object (decoded strictly).
type object struct {
	Kind, Name string
	Labels     map[string]string
	Annots     map[string]string
	Doc        []byte
	Obj        any
	Hook       bool
}

type objects []object

func (os objects) find(kind, name string) (object, bool) {
	for _, o := range os {
		if o.Kind == kind && o.Name == name {
			return o, true
		}
	}
	return object{}, false
}

func (os objects) names(kind string) []string {
	var out []string
	for _, o := range os {
		if o.Kind == kind {
			out = append(out, o.Name)
		}
	}
	return out
}

// typed returns an empty value of the Go type of a kind the tests read.
func typed(kind string) any {
	switch kind {
	case "Deployment":
		return &appsv1.Deployment{}
	case "CronJob":
		return &batchv1.CronJob{}
	case "Job":
		return &batchv1.Job{}
	case "ConfigMap":
		return &corev1.ConfigMap{}
	case "Secret":
		return &corev1.Secret{}
	case "ServiceAccount":
		return &corev1.ServiceAccount{}
	case "PodDisruptionBudget":
		return &policyv1.PodDisruptionBudget{}
	case "NetworkPolicy":
		return &networkingv1.NetworkPolicy{}
	case "Service":
		return &corev1.Service{}
	case "StatefulSet":
		return &appsv1.StatefulSet{}
	case "Namespace":
		return &corev1.Namespace{}
	}
	return &map[string]any{}
}

func decode(t *testing.T, stream string, hook bool) objects {
	t.Helper()
	var out objects
	for _, doc := range strings.Split(stream, "\n---") {
		doc = strings.TrimSpace(strings.TrimPrefix(doc, "\n"))
		if doc == "" || strings.Trim(doc, "-\n ") == "" {
			continue
		}
		var meta struct {
			Kind     string `json:"kind"`
			Metadata struct {
				Name        string            `json:"name"`
				Labels      map[string]string `json:"labels"`
				Annotations map[string]string `json:"annotations"`
			} `json:"metadata"`
		}
		if err := yaml.Unmarshal([]byte(doc), &meta); err != nil {
			t.Fatalf("decode: %v\n%s", err, doc)
		}
		if meta.Kind == "" {
			continue // a document of comments only
		}
		obj := typed(meta.Kind)
		if err := yaml.UnmarshalStrict([]byte(doc), obj); err != nil {
			t.Fatalf("%s %s: strict decode: %v\n%s", meta.Kind, meta.Metadata.Name, err, doc)
		}
		out = append(out, object{Kind: meta.Kind, Name: meta.Metadata.Name, Labels: meta.Metadata.Labels, Annots: meta.Metadata.Annotations, Doc: []byte(doc), Obj: obj, Hook: hook})
	}
	return out
}

// renderChart renders the chart with values over its defaults, as `helm
// template` does (client-side dry run of an install), hooks included. The
// values are validated against values.schema.json on the way.
func renderChart(t *testing.T, values map[string]any) objects {
	t.Helper()
	out, err := tryRenderChart(values)
	if err != nil {
		t.Fatal(err)
	}
	return decode(t, out.manifest, false).append(decode(t, out.hooks, true))
}

func (os objects) append(more objects) objects { return append(os, more...) }

type chartOutput struct{ manifest, hooks string }

func tryRenderChart(values map[string]any) (chartOutput, error) {
	ch, err := loader.Load(chartDir)
	if err != nil {
		return chartOutput{}, fmt.Errorf("load chart: %w", err)
	}
	cfg := action.NewConfiguration()
	cfg.SetLogger(slog.NewTextHandler(io.Discard, nil))
	in := action.NewInstall(cfg)
	in.DryRunStrategy = action.DryRunClient
	in.Replace = true
	in.ReleaseName = "idemd"
	in.Namespace = namespace
	// `helm template` assumes Kubernetes 1.20, below the chart's
	// kubeVersion; render for the oldest version the chart supports.
	kv, err := common.ParseKubeVersion(kubeVersion)
	if err != nil {
		return chartOutput{}, err
	}
	in.KubeVersion = kv
	rel, err := in.RunWithContext(context.Background(), ch, values)
	if err != nil {
		return chartOutput{}, fmt.Errorf("render chart: %w", err)
	}
	r, ok := rel.(*release.Release)
	if !ok {
		return chartOutput{}, fmt.Errorf("render chart: a %T, not a v1 release", rel)
	}
	var hooks bytes.Buffer
	for _, h := range r.Hooks {
		fmt.Fprintf(&hooks, "\n---\n%s\n", h.Manifest)
	}
	return chartOutput{manifest: r.Manifest, hooks: hooks.String()}, nil
}

// TestLint: Helm's linter (helm lint --strict) finds nothing to warn about.
func TestLint(t *testing.T) {
	abs, err := filepath.Abs(chartDir)
	if err != nil {
		t.Fatal(err)
	}
	l := lint.RunAll(abs, nil, namespace)
	for _, m := range l.Messages {
		if m.Severity >= support.WarningSev {
			t.Errorf("helm lint: %s", m)
		}
	}
	if len(l.Messages) > 0 {
		t.Logf("helm lint: %d messages below warning: %v", len(l.Messages), l.Messages)
	}
}

// TestFilesInSync: the chart ships copies of the alerts and the dashboard
// (a chart can read no file outside its directory); they must be the files
// in deploy/observability, byte for byte.
func TestFilesInSync(t *testing.T) {
	for chartFile, source := range map[string]string{
		"idemd/files/prometheusrule.yaml":    "../observability/prometheusrule.yaml",
		"idemd/files/grafana-dashboard.json": "../observability/grafana-dashboard.json",
	} {
		a, err := os.ReadFile(chartFile)
		if err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(source)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(a, b) {
			t.Errorf("deploy/helm/%s differs from deploy/%s: cp deploy/%[2]s deploy/helm/%[1]s", chartFile, strings.TrimPrefix(source, "../"))
		}
	}
}
