package helm

import (
	"bytes"
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/applyconfigurations"
	"k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"
)

// The schema the rendered objects are validated against, offline.
//
// Built-in kinds: client-go's structured schema of every built-in API type
// (applyconfigurations.NewTypeConverter), which client-go generates from the
// OpenAPI document of its Kubernetes release and which the API server uses
// for server-side apply. It is the OpenAPI schema reduced to what a
// manifest may contain: an unknown field, a wrong type (a string where an
// integer belongs, a map for a list) or an apiVersion/kind the release does
// not serve is an error, as `kubectl apply --validate=strict` would report.
// The release is client-go's in go.mod (v0.37: Kubernetes 1.37). Older
// supported releases (the chart's kubeVersion) are not checked by this: a
// field added after 1.30 would pass here.
//
// prometheus-operator's kinds (PodMonitor, PrometheusRule): decoded with
// unknown fields disallowed into the operator's own Go types
// (github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring),
// from which its CRDs' schemas are generated.
var typeConverter = applyconfigurations.NewTypeConverter(scheme.Scheme)

// validateDocument checks one rendered YAML document against the schema of
// its kind.
func validateDocument(doc []byte) error {
	js, err := yaml.YAMLToJSONStrict(doc)
	if err != nil {
		return fmt.Errorf("validate: yaml: %w", err)
	}
	var u unstructured.Unstructured
	if err := u.UnmarshalJSON(js); err != nil {
		return fmt.Errorf("validate: %w", err)
	}
	gvk := u.GroupVersionKind()
	if gvk.Group == monitoringv1.SchemeGroupVersion.Group {
		var obj any
		switch gvk.Version + " " + gvk.Kind {
		case "v1 PodMonitor":
			obj = &monitoringv1.PodMonitor{}
		case "v1 PrometheusRule":
			obj = &monitoringv1.PrometheusRule{}
		default:
			return fmt.Errorf("validate %s: no prometheus-operator type for it", gvk)
		}
		dec := json.NewDecoder(bytes.NewReader(js))
		dec.DisallowUnknownFields()
		if err := dec.Decode(obj); err != nil {
			return fmt.Errorf("validate %s %s: %w", gvk.Kind, u.GetName(), err)
		}
		return nil
	}
	if _, err := typeConverter.ObjectToTyped(&u); err != nil {
		return fmt.Errorf("validate %s %s: %w", gvk, u.GetName(), err)
	}
	return nil
}

// documents splits a rendered stream into its non-empty YAML documents.
func documents(stream string) [][]byte {
	var out [][]byte
	for _, doc := range strings.Split("\n"+stream, "\n---") {
		var probe map[string]any
		if err := yaml.Unmarshal([]byte(doc), &probe); err == nil && len(probe) == 0 {
			continue // empty, or comments only
		}
		out = append(out, []byte(doc))
	}
	return out
}

// kustomizeStream renders dir (relative to deploy/) as `kubectl apply -k`.
func kustomizeStream(t *testing.T, dir string) string {
	t.Helper()
	abs, err := filepath.Abs(filepath.Join("..", dir))
	if err != nil {
		t.Fatal(err)
	}
	m, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(filesys.MakeFsOnDisk(), abs)
	if err != nil {
		t.Fatalf("kustomize %s: %v", dir, err)
	}
	out, err := m.AsYaml()
	if err != nil {
		t.Fatal(err)
	}
	return string(out)
}

// TestRenderedObjectsMatchKubernetesSchema: every object of every
// rendering an operator can apply (the kustomize base, each overlay, the
// monitoring kustomization, the chart with its defaults and with every
// switch and option turned) is valid for the Kubernetes API and the
// prometheus-operator CRDs.
func TestRenderedObjectsMatchKubernetesSchema(t *testing.T) {
	chart := func(values map[string]any) func(*testing.T) string {
		return func(t *testing.T) string {
			out, err := tryRenderChart(values)
			if err != nil {
				t.Fatal(err)
			}
			return out.manifest + "\n---\n" + out.hooks
		}
	}
	kustomize := func(dir string) func(*testing.T) string {
		return func(t *testing.T) string { return kustomizeStream(t, dir) }
	}
	off := map[string]any{"enabled": false}
	renderings := []struct {
		name   string
		stream func(*testing.T) string
		// kinds that must be among the objects checked, so a rendering
		// that silently loses them does not pass by checking less.
		kinds []string
	}{
		{"kustomize base", kustomize("base"), []string{"Deployment", "CronJob", "Job", "NetworkPolicy", "PodDisruptionBudget"}},
		{"kustomize overlays/dev", kustomize("overlays/dev"), []string{"StatefulSet", "Service", "Secret", "ConfigMap"}},
		{"kustomize overlays/production", kustomize("overlays/production"), []string{"Deployment", "CronJob"}},
		{"kustomize observability", kustomize("observability"), []string{"PodMonitor", "PrometheusRule", "ConfigMap"}},
		{"chart defaults", chart(nil), []string{"Deployment", "CronJob", "Job", "PodMonitor", "PrometheusRule", "ConfigMap"}},
		{"chart options", chart(map[string]any{
			"enqueuer":         off,
			"console":          off,
			"podAnnotations":   map[string]any{"vault.hashicorp.com/agent-inject": "true"},
			"imagePullSecrets": []any{map[string]any{"name": "registry"}},
			"extraVolumes":     []any{map[string]any{"name": "token", "emptyDir": map[string]any{"medium": "Memory"}}},
			"extraVolumeMounts": []any{map[string]any{"name": "token", "mountPath": "/var/run/idemd",
				"readOnly": true}},
			"database": map[string]any{"passwordFile": "/var/run/idemd/password", "migratePasswordFile": "/var/run/idemd/migrate-password"},
			"image":    map[string]any{"digest": "sha256:" + strings.Repeat("ab", 32)},
			"monitoring": map[string]any{
				"podMonitor":     map[string]any{"labels": map[string]any{"release": "prom"}, "interval": "15s"},
				"prometheusRule": map[string]any{"labels": map[string]any{"release": "prom"}},
				"dashboard":      map[string]any{"annotations": map[string]any{"grafana_folder": "idemd"}},
			},
		}), []string{"Deployment", "CronJob", "Job", "PodMonitor"}},
		{"chart every pod value", chart(allPodValues()), []string{"Deployment", "CronJob", "Job", "NetworkPolicy", "ServiceAccount"}},
		{"chart minimal", chart(map[string]any{
			"enqueuer": off, "completer": off, "console": off, "networkPolicy": off,
			"monitoring": map[string]any{"podMonitor": off, "prometheusRule": off, "dashboard": off},
		}), []string{"CronJob", "Job"}},
	}
	for _, r := range renderings {
		t.Run(r.name, func(t *testing.T) {
			seen := map[string]int{}
			for _, doc := range documents(r.stream(t)) {
				var meta struct {
					Kind string `json:"kind"`
				}
				if err := yaml.Unmarshal(doc, &meta); err != nil {
					t.Fatalf("decode: %v\n%s", err, doc)
				}
				seen[meta.Kind]++
				if err := validateDocument(doc); err != nil {
					t.Errorf("%v\n%s", err, doc)
				}
			}
			for _, k := range r.kinds {
				if seen[k] == 0 {
					t.Errorf("no %s among the objects checked (%v)", k, seen)
				}
			}
		})
	}
}

// TestSchemaValidationCatchesMistakes: the validation above fails on the
// mistakes it is there for, in real rendered objects: a misspelt field at
// any depth, a value of the wrong type, an unknown kind, and the same in a
// PodMonitor and a PrometheusRule.
func TestSchemaValidationCatchesMistakes(t *testing.T) {
	out, err := tryRenderChart(nil)
	if err != nil {
		t.Fatal(err)
	}
	find := func(kind, name string) string {
		for _, doc := range documents(out.manifest) {
			var meta struct {
				Kind     string `json:"kind"`
				Metadata struct {
					Name string `json:"name"`
				} `json:"metadata"`
			}
			if err := yaml.Unmarshal(doc, &meta); err == nil && meta.Kind == kind && meta.Metadata.Name == name {
				return string(doc)
			}
		}
		t.Fatalf("the chart renders no %s %s", kind, name)
		return ""
	}
	deployment, podMonitor, rule := find("Deployment", "idemd-completer"), find("PodMonitor", "idemd"), find("PrometheusRule", "idemd")
	for _, doc := range []string{deployment, podMonitor, rule} {
		if err := validateDocument([]byte(doc)); err != nil {
			t.Fatalf("the unchanged object fails: %v", err)
		}
	}
	mutations := []struct {
		name, doc, old, new string
	}{
		{"misspelt top-level spec field", deployment, "\n  replicas:", "\n  replica:"},
		{"misspelt container field", deployment, "readOnlyRootFilesystem:", "readOnlyRootFileSystem:"},
		{"misspelt probe field", deployment, "periodSeconds:", "periodSecond:"},
		{"string for an integer", deployment, "containerPort: 9090", "containerPort: \"nine\""},
		{"unknown kind", deployment, "kind: Deployment", "kind: Deploymnet"},
		{"unknown apiVersion", deployment, "apiVersion: apps/v1", "apiVersion: apps/v2"},
		{"misspelt PodMonitor field", podMonitor, "podMetricsEndpoints:", "podMetricEndpoints:"},
		{"misspelt PrometheusRule field", rule, "expr:", "expression:"},
	}
	for _, m := range mutations {
		t.Run(m.name, func(t *testing.T) {
			if !strings.Contains(m.doc, m.old) {
				t.Fatalf("the rendered object has no %q to change", m.old)
			}
			if err := validateDocument([]byte(strings.Replace(m.doc, m.old, m.new, 1))); err == nil {
				t.Errorf("%q changed to %q: validation passed", m.old, m.new)
			} else {
				t.Logf("rejected: %v", err)
			}
		})
	}
}
