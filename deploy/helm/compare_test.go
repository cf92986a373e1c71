package helm

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"helm.sh/helm/v4/pkg/chart/v2/loader"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
)

// renderKustomize renders dir (relative to deploy/) with the kustomize
// library (the one kubectl embeds), its `idemd` image set to ref as an
// overlay would set it.
func renderKustomize(t *testing.T, dir, ref string) objects {
	t.Helper()
	abs, err := filepath.Abs(filepath.Join("..", dir))
	if err != nil {
		t.Fatal(err)
	}
	name, tag, _ := strings.Cut(ref, ":")
	tmp := t.TempDir()
	// kustomize takes a directory resource by a relative path only.
	if abs, err = filepath.Rel(tmp, abs); err != nil {
		t.Fatal(err)
	}
	k := fmt.Sprintf("apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n  - %s\nimages:\n  - name: idemd\n    newName: %s\n    newTag: %q\n", abs, name, tag)
	if err := os.WriteFile(filepath.Join(tmp, "kustomization.yaml"), []byte(k), 0o644); err != nil {
		t.Fatal(err)
	}
	m, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(filesys.MakeFsOnDisk(), tmp)
	if err != nil {
		t.Fatalf("kustomize %s: %v", dir, err)
	}
	out, err := m.AsYaml()
	if err != nil {
		t.Fatal(err)
	}
	return decode(t, string(out), false)
}

// appVersion is the chart's appVersion: the image tag by default.
func appVersion(t *testing.T) string {
	t.Helper()
	ch, err := loader.Load(chartDir)
	if err != nil {
		t.Fatal(err)
	}
	return ch.Metadata.AppVersion
}

// pod is a workload's pod template.
func pod(o object) *corev1.PodTemplateSpec {
	switch v := o.Obj.(type) {
	case *appsv1.Deployment:
		return &v.Spec.Template
	case *batchv1.CronJob:
		return &v.Spec.JobTemplate.Spec.Template
	case *batchv1.Job:
		return &v.Spec.Template
	}
	return nil
}

// env resolves what a container starts with: envFrom ConfigMaps (by name,
// kustomize's hash suffix and all), then env; a Secret's key is named, not
// valued. ConfigMaps are looked up by name without a hash suffix.
func env(t reporter, all objects, c corev1.Container) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, from := range c.EnvFrom {
		if from.ConfigMapRef == nil {
			t.Errorf("container %s: envFrom other than a ConfigMap", c.Name)
			continue
		}
		cm := configMap(all, from.ConfigMapRef.Name)
		if cm == nil {
			t.Errorf("container %s: envFrom ConfigMap %s is not rendered", c.Name, from.ConfigMapRef.Name)
			continue
		}
		for k, v := range cm.Data {
			out[from.Prefix+k] = v
		}
	}
	for _, e := range c.Env {
		switch {
		case e.ValueFrom == nil:
			out[e.Name] = e.Value
		case e.ValueFrom.SecretKeyRef != nil:
			out[e.Name] = "secret " + e.ValueFrom.SecretKeyRef.Name + "/" + e.ValueFrom.SecretKeyRef.Key
		default:
			t.Errorf("container %s: env %s from something other than a Secret", c.Name, e.Name)
		}
	}
	return out
}

func configMap(all objects, name string) *corev1.ConfigMap {
	for _, o := range all {
		if cm, ok := o.Obj.(*corev1.ConfigMap); ok && o.Kind == "ConfigMap" && cm.Name == name {
			return cm
		}
	}
	return nil
}

// workloadView is what must agree between the two renderings of a
// workload: its schedule and sizing, and per container the image, command,
// probes, security contexts, resources and resolved environment.
type workloadView struct {
	Replicas                      *int32
	Schedule, TimeZone            string
	Suspend                       *bool
	ConcurrencyPolicy             batchv1.ConcurrencyPolicy
	StartingDeadlineSeconds       *int64
	BackoffLimit                  *int32
	ActiveDeadlineSeconds         *int64
	PodFailurePolicy              *batchv1.PodFailurePolicy
	Strategy                      *appsv1.DeploymentStrategy
	SelectorLabels                map[string]string
	PodLabels                     map[string]string
	PodSecurityContext            *corev1.PodSecurityContext
	TerminationGracePeriodSeconds *int64
	AutomountToken                *bool
	EnableServiceLinks            *bool
	RestartPolicy                 corev1.RestartPolicy
	Topology                      []corev1.TopologySpreadConstraint
	Volumes                       []corev1.Volume
	Containers                    []containerView
}

type containerView struct {
	Name, Image     string
	ImagePullPolicy corev1.PullPolicy
	Command, Args   []string
	Env             map[string]string
	Ports           []corev1.ContainerPort
	Readiness       *corev1.Probe
	Liveness        *corev1.Probe
	Resources       corev1.ResourceRequirements
	SecurityContext *corev1.SecurityContext
	VolumeMounts    []corev1.VolumeMount
}

func view(t reporter, all objects, o object) workloadView {
	t.Helper()
	var v workloadView
	switch w := o.Obj.(type) {
	case *appsv1.Deployment:
		v.Replicas, v.Strategy, v.SelectorLabels = w.Spec.Replicas, &w.Spec.Strategy, w.Spec.Selector.MatchLabels
	case *batchv1.CronJob:
		v.Schedule, v.Suspend, v.ConcurrencyPolicy, v.StartingDeadlineSeconds = w.Spec.Schedule, w.Spec.Suspend, w.Spec.ConcurrencyPolicy, w.Spec.StartingDeadlineSeconds
		if w.Spec.TimeZone != nil {
			v.TimeZone = *w.Spec.TimeZone
		}
		js := w.Spec.JobTemplate.Spec
		v.BackoffLimit, v.ActiveDeadlineSeconds, v.PodFailurePolicy = js.BackoffLimit, js.ActiveDeadlineSeconds, js.PodFailurePolicy
	case *batchv1.Job:
		v.BackoffLimit, v.ActiveDeadlineSeconds, v.PodFailurePolicy = w.Spec.BackoffLimit, w.Spec.ActiveDeadlineSeconds, w.Spec.PodFailurePolicy
	}
	p := pod(o)
	v.PodLabels = p.Labels
	s := p.Spec
	v.PodSecurityContext, v.TerminationGracePeriodSeconds = s.SecurityContext, s.TerminationGracePeriodSeconds
	v.AutomountToken, v.EnableServiceLinks, v.RestartPolicy = s.AutomountServiceAccountToken, s.EnableServiceLinks, s.RestartPolicy
	v.Topology, v.Volumes = s.TopologySpreadConstraints, s.Volumes
	for _, c := range s.Containers {
		v.Containers = append(v.Containers, containerView{
			Name: c.Name, Image: c.Image, ImagePullPolicy: c.ImagePullPolicy, Command: c.Command, Args: c.Args,
			Env: env(t, all, c), Ports: c.Ports, Readiness: c.ReadinessProbe, Liveness: c.LivenessProbe,
			Resources: c.Resources, SecurityContext: c.SecurityContext, VolumeMounts: c.VolumeMounts,
		})
	}
	return v
}

// diff names the fields in which a and b differ, as JSON.
func diff(a, b any) []string {
	var ma, mb map[string]any
	ja, _ := json.Marshal(a)
	jb, _ := json.Marshal(b)
	_ = json.Unmarshal(ja, &ma)
	_ = json.Unmarshal(jb, &mb)
	var out []string
	keys := map[string]bool{}
	for k := range ma {
		keys[k] = true
	}
	for k := range mb {
		keys[k] = true
	}
	for _, k := range slices.Sorted(func(yield func(string) bool) {
		for k := range keys {
			if !yield(k) {
				return
			}
		}
	}) {
		if !reflect.DeepEqual(ma[k], mb[k]) {
			x, _ := json.Marshal(ma[k])
			y, _ := json.Marshal(mb[k])
			out = append(out, fmt.Sprintf("%s: kustomize %s, chart %s", k, x, y))
		}
	}
	return out
}

// TestChartMatchesKustomize: with its default values, the chart renders
// every workload of the kustomize base (image set to the chart's default)
// with the same images, commands, probes, security contexts, resources,
// environment, volumes and schedules, and the same disruption budgets,
// network policies and monitoring objects.
func TestChartMatchesKustomize(t *testing.T) {
	ref := "ghcr.io/idemd/idemd:" + appVersion(t)
	kz := renderKustomize(t, "base", ref).append(renderKustomize(t, "observability", ref))
	compareRenderings(t, kz, renderChart(t, nil))
}

// TestComparisonCatchesDrift: the comparison reports a chart that differs
// from kustomize in each of the things it compares.
func TestComparisonCatchesDrift(t *testing.T) {
	ref := "ghcr.io/idemd/idemd:" + appVersion(t)
	kz := renderKustomize(t, "base", ref).append(renderKustomize(t, "observability", ref))
	for what, c := range map[string]struct {
		values map[string]any
		want   string
	}{
		"image":       {map[string]any{"image": map[string]any{"tag": "0.0.1"}}, "Image"},
		"resources":   {map[string]any{"enqueuer": map[string]any{"resources": map[string]any{"requests": map[string]any{"cpu": "1"}, "limits": map[string]any{"memory": "1Gi"}}}}, "Resources"},
		"environment": {map[string]any{"completer": map[string]any{"config": map[string]any{"IDEMD_RATE": "5"}}}, "IDEMD_RATE"},
		"schedule":    {map[string]any{"reaper": map[string]any{"schedule": "0 * * * *"}}, "Schedule"},
		"replicas":    {map[string]any{"completer": map[string]any{"replicas": 3}}, "Replicas"},
		"a workload":  {map[string]any{"console": map[string]any{"enabled": false}}, "not in the chart"},
		"monitoring":  {map[string]any{"monitoring": map[string]any{"podMonitor": map[string]any{"interval": "1m"}}}, "podMetricsEndpoints"},
	} {
		r := &recorder{}
		compareRenderings(r, kz, renderChart(t, c.values))
		if !strings.Contains(strings.Join(r.errors, "\n"), c.want) {
			t.Errorf("%s: a chart that differs was not reported (want %q): %q", what, c.want, r.errors)
		}
	}
}

// reporter is what compareRenderings needs of a *testing.T.
type reporter interface {
	Helper()
	Errorf(string, ...any)
	Fatalf(string, ...any)
}

type recorder struct{ errors []string }

func (r *recorder) Helper()                   {}
func (r *recorder) Errorf(f string, a ...any) { r.errors = append(r.errors, fmt.Sprintf(f, a...)) }
func (r *recorder) Fatalf(f string, a ...any) { r.Errorf(f, a...) }

func compareRenderings(t reporter, kz, ch objects) {
	t.Helper()

	workloads := 0
	for _, o := range kz {
		if pod(o) == nil {
			continue
		}
		workloads++
		c, ok := ch.find(o.Kind, o.Name)
		if !ok {
			t.Errorf("%s %s: in the kustomize base, not in the chart", o.Kind, o.Name)
			continue
		}
		kv, cv := view(t, kz, o), view(t, ch, c)
		if o.Kind == "Job" {
			// The migration hook runs before the release's ServiceAccount
			// and ConfigMaps exist (pre-install): it has its environment
			// inline (compared, resolved) and no ServiceAccount of its own.
			if sa := pod(c).Spec.ServiceAccountName; sa != "" {
				t.Errorf("chart Job %s: serviceAccountName %q, which a pre-install hook cannot rely on", c.Name, sa)
			}
		} else if a, b := pod(o).Spec.ServiceAccountName, pod(c).Spec.ServiceAccountName; a != b {
			t.Errorf("%s %s: serviceAccountName: kustomize %q, chart %q", o.Kind, o.Name, a, b)
		}
		for _, d := range diff(kv, cv) {
			t.Errorf("%s %s: %s", o.Kind, o.Name, d)
		}
	}
	if workloads < 6 {
		t.Fatalf("the kustomize base rendered %d workloads, want at least 6", workloads)
		return
	}
	for _, o := range ch {
		if pod(o) != nil {
			if _, ok := kz.find(o.Kind, o.Name); !ok {
				t.Errorf("%s %s: in the chart, not in the kustomize base", o.Kind, o.Name)
			}
		}
	}

	// The other objects: their specs (and, for ConfigMaps, data) agree.
	for _, kind := range []string{"PodDisruptionBudget", "NetworkPolicy", "PodMonitor", "PrometheusRule", "ServiceAccount"} {
		kn, cn := kz.names(kind), ch.names(kind)
		slices.Sort(kn)
		slices.Sort(cn)
		if !slices.Equal(kn, cn) {
			t.Errorf("%s: kustomize renders %v, the chart %v", kind, kn, cn)
		}
		for _, name := range kn {
			k, _ := kz.find(kind, name)
			c, ok := ch.find(kind, name)
			if !ok {
				continue
			}
			for _, d := range diff(specOf(t, k), specOf(t, c)) {
				t.Errorf("%s %s: %s", kind, name, d)
			}
			for l, v := range k.Labels {
				if c.Labels[l] != v {
					t.Errorf("%s %s: label %s: kustomize %q, chart %q", kind, name, l, v, c.Labels[l])
				}
			}
		}
	}
	kd, cd := configMap(kz, "idemd-grafana-dashboard"), configMap(ch, "idemd-grafana-dashboard")
	if kd == nil || cd == nil {
		t.Fatalf("the dashboard ConfigMap: kustomize %v, chart %v", kd != nil, cd != nil)
		return
	}
	if !reflect.DeepEqual(kd.Data, cd.Data) || cd.Labels["grafana_dashboard"] != "1" {
		t.Errorf("the dashboard ConfigMap differs (labels: kustomize %v, chart %v)", kd.Labels, cd.Labels)
	}
}

// specOf is a rendered object without its metadata: what it does.
func specOf(t reporter, o object) map[string]any {
	t.Helper()
	var m map[string]any
	b, err := json.Marshal(o.Obj)
	if err == nil {
		err = json.Unmarshal(b, &m)
	}
	if err != nil {
		t.Fatalf("%s %s: %v", o.Kind, o.Name, err)
	}
	delete(m, "metadata")
	delete(m, "status")
	return m
}
