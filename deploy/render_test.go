// Package deploy holds the tests of idemd's Kubernetes manifests: every
// overlay is rendered with kustomize, as `kubectl apply -k` would, and each
// object is decoded strictly into the Kubernetes API types, so a misspelt
// field fails here and not in a cluster at 3 a.m.
package deploy

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"testing"

	"go.uber.org/goleak"
	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"
)

func TestMain(m *testing.M) {
	code := m.Run()
	if binDir != "" {
		os.RemoveAll(binDir)
	}
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// overlays are the kustomizations an operator applies (TestOverlaysListed
// keeps the list complete). The base is rendered on its own only where a
// test needs the manifests before any overlay changed them.
var overlays = []string{"overlays/dev", "overlays/production"}

// object is one rendered manifest, decoded into its typed form.
type object struct {
	Kind, Name, Namespace string
	Obj                   any
}

func (o object) String() string { return o.Kind + "/" + o.Name }

// rendered is the output of one kustomization.
type rendered struct {
	Dir     string
	Objects []object
}

func (r *rendered) byKind(kind string) []object {
	var out []object
	for _, o := range r.Objects {
		if o.Kind == kind {
			out = append(out, o)
		}
	}
	return out
}

func (r *rendered) find(kind, name string) (object, bool) {
	for _, o := range r.Objects {
		if o.Kind == kind && o.Name == name {
			return o, true
		}
	}
	return object{}, false
}

// kustomizeYAML renders dir (relative to deploy/) with the kustomize library
// at the version kubectl embeds, reading the real files on disk.
func kustomizeYAML(dir string) ([]byte, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, err
	}
	k := krusty.MakeKustomizer(krusty.MakeDefaultOptions())
	m, err := k.Run(filesys.MakeFsOnDisk(), abs)
	if err != nil {
		return nil, fmt.Errorf("kustomize %s: %w", dir, err)
	}
	return m.AsYaml()
}

// render renders dir and decodes every object strictly.
func render(t *testing.T, dir string) *rendered {
	t.Helper()
	out, err := kustomizeYAML(dir)
	if err != nil {
		t.Fatal(err)
	}
	return decodeAll(t, dir, out)
}

// decodeAll decodes a rendered stream strictly.
func decodeAll(t *testing.T, dir string, out []byte) *rendered {
	t.Helper()
	r := &rendered{Dir: dir}
	for i, doc := range splitYAML(out) {
		o, err := decodeStrict(doc)
		if err != nil {
			t.Fatalf("%s: document %d: %v\n%s", dir, i, err, doc)
		}
		r.Objects = append(r.Objects, o)
	}
	if len(r.Objects) == 0 {
		t.Fatalf("%s rendered no objects", dir)
	}
	return r
}

func splitYAML(b []byte) [][]byte {
	var docs [][]byte
	for _, d := range bytes.Split(b, []byte("\n---\n")) {
		if len(bytes.TrimSpace(d)) > 0 {
			docs = append(docs, d)
		}
	}
	return docs
}

// typedObject returns an empty value of the Go type for apiVersion/kind.
// A kind that is not listed fails the test: adding a new kind of object to
// the manifests means deciding how it is checked.
func typedObject(apiVersion, kind string) (any, error) {
	switch apiVersion + " " + kind {
	case "v1 Namespace":
		return &corev1.Namespace{}, nil
	case "v1 ServiceAccount":
		return &corev1.ServiceAccount{}, nil
	case "v1 ConfigMap":
		return &corev1.ConfigMap{}, nil
	case "v1 Secret":
		return &corev1.Secret{}, nil
	case "v1 Service":
		return &corev1.Service{}, nil
	case "apps/v1 Deployment":
		return &appsv1.Deployment{}, nil
	case "apps/v1 StatefulSet":
		return &appsv1.StatefulSet{}, nil
	case "autoscaling/v2 HorizontalPodAutoscaler":
		return &autoscalingv2.HorizontalPodAutoscaler{}, nil
	case "batch/v1 CronJob":
		return &batchv1.CronJob{}, nil
	case "batch/v1 Job":
		return &batchv1.Job{}, nil
	case "policy/v1 PodDisruptionBudget":
		return &policyv1.PodDisruptionBudget{}, nil
	case "networking.k8s.io/v1 NetworkPolicy":
		return &networkingv1.NetworkPolicy{}, nil
	case "monitoring.coreos.com/v1 PrometheusRule":
		return &prometheusRule{}, nil
	case "monitoring.coreos.com/v1 PodMonitor":
		return &podMonitor{}, nil
	}
	return nil, fmt.Errorf("no Go type registered for %s %s", apiVersion, kind)
}

// decodeStrict decodes one YAML document, rejecting unknown and duplicate
// fields.
func decodeStrict(doc []byte) (object, error) {
	var meta struct {
		APIVersion string `json:"apiVersion"`
		Kind       string `json:"kind"`
		Metadata   struct {
			Name      string `json:"name"`
			Namespace string `json:"namespace"`
		} `json:"metadata"`
	}
	if err := yaml.Unmarshal(doc, &meta); err != nil {
		return object{}, err
	}
	obj, err := typedObject(meta.APIVersion, meta.Kind)
	if err != nil {
		return object{}, err
	}
	if err := yaml.UnmarshalStrict(doc, obj); err != nil {
		return object{}, fmt.Errorf("%s %s: strict decode: %w", meta.Kind, meta.Metadata.Name, err)
	}
	return object{Kind: meta.Kind, Name: meta.Metadata.Name, Namespace: meta.Metadata.Namespace, Obj: obj}, nil
}

// workload is a pod template with where it came from.
type workload struct {
	Owner object
	Pod   *corev1.PodTemplateSpec
}

func (w workload) String() string { return w.Owner.String() }

func (r *rendered) workloads() []workload {
	var out []workload
	for _, w := range r.pods() {
		// Only idemd's own: not what an overlay runs beside it (the dev
		// overlay's PostgreSQL and Rocket Rides, part-of: idemd-dev).
		if m, ok := w.Owner.Obj.(metav1.Object); ok && m.GetLabels()["app.kubernetes.io/part-of"] == "idemd" {
			out = append(out, w)
		}
	}
	return out
}

// pods is every pod template: idemd's workloads and the others an overlay
// adds (the dev overlay's PostgreSQL and Rocket Rides), for the checks that
// hold for any pod in the namespace (Pod Security, references).
func (r *rendered) pods() []workload {
	var out []workload
	for _, o := range r.Objects {
		switch v := o.Obj.(type) {
		case *appsv1.Deployment:
			out = append(out, workload{o, &v.Spec.Template})
		case *appsv1.StatefulSet:
			out = append(out, workload{o, &v.Spec.Template})
		case *batchv1.CronJob:
			out = append(out, workload{o, &v.Spec.JobTemplate.Spec.Template})
		case *batchv1.Job:
			out = append(out, workload{o, &v.Spec.Template})
		}
	}
	return out
}

// configData returns the keys of a rendered ConfigMap or Secret.
func (r *rendered) configData(kind, name string) (map[string]string, bool) {
	o, ok := r.find(kind, name)
	if !ok {
		return nil, false
	}
	data := map[string]string{}
	switch v := o.Obj.(type) {
	case *corev1.ConfigMap:
		for k, val := range v.Data {
			data[k] = val
		}
	case *corev1.Secret:
		for k, val := range v.Data {
			data[k] = string(val)
		}
		for k, val := range v.StringData {
			data[k] = val
		}
	}
	return data, true
}

// containerEnv resolves the environment a container starts with, as far as
// the manifests determine it: explicit values, ConfigMaps and rendered
// Secrets. Values from Secrets that are created out of band are known by
// name only (from secret.example.yaml) and have the value "<secret>".
func (r *rendered) containerEnv(t *testing.T, c *corev1.Container) map[string]string {
	t.Helper()
	env := map[string]string{}
	for _, from := range c.EnvFrom {
		switch {
		case from.ConfigMapRef != nil:
			data, ok := r.configData("ConfigMap", from.ConfigMapRef.Name)
			if !ok {
				t.Errorf("%s: container %s: envFrom ConfigMap %q is not rendered", r.Dir, c.Name, from.ConfigMapRef.Name)
			}
			for k, v := range data {
				env[from.Prefix+k] = v
			}
		case from.SecretRef != nil:
			data, ok := r.configData("Secret", from.SecretRef.Name)
			if !ok {
				data = exampleSecretKeys(t, from.SecretRef.Name)
			}
			for k, v := range data {
				env[from.Prefix+k] = v
			}
		}
	}
	for _, e := range c.Env {
		switch {
		case e.ValueFrom == nil:
			env[e.Name] = e.Value
		case e.ValueFrom.SecretKeyRef != nil:
			env[e.Name] = "<secret>"
		case e.ValueFrom.ConfigMapKeyRef != nil:
			data, _ := r.configData("ConfigMap", e.ValueFrom.ConfigMapKeyRef.Name)
			env[e.Name] = data[e.ValueFrom.ConfigMapKeyRef.Key]
		default:
			env[e.Name] = "<field>"
		}
	}
	return env
}

// exampleSecretKeys returns the keys of a Secret documented in
// base/secret.example.yaml, each with the value "<secret>".
func exampleSecretKeys(t *testing.T, name string) map[string]string {
	t.Helper()
	b, err := os.ReadFile("base/secret.example.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for _, doc := range splitYAML(b) {
		o, err := decodeStrict(doc)
		if err != nil {
			t.Fatalf("secret.example.yaml: %v", err)
		}
		s, ok := o.Obj.(*corev1.Secret)
		if !ok || s.Name != name {
			continue
		}
		keys := map[string]string{}
		for k := range s.StringData {
			keys[k] = "<secret>"
		}
		for k := range s.Data {
			keys[k] = "<secret>"
		}
		return keys
	}
	return nil
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// TestDecodeStrictRejectsUnknownFields guards the guard: a misspelt field
// must fail decoding, not be dropped silently as kubectl apply would do
// with client-side validation off.
func TestDecodeStrictRejectsUnknownFields(t *testing.T) {
	for name, doc := range map[string]string{
		"misspelt field":  "apiVersion: v1\nkind: ServiceAccount\nmetadata:\n  name: x\nautomountServiceAccountTokn: false\n",
		"duplicate field": "apiVersion: v1\nkind: ServiceAccount\nmetadata:\n  name: x\n  name: y\n",
		"unknown kind":    "apiVersion: v1\nkind: Pod\nmetadata:\n  name: x\n",
	} {
		if _, err := decodeStrict([]byte(doc)); err == nil {
			t.Errorf("%s: decoded without error", name)
		}
	}
	if _, err := decodeStrict([]byte("apiVersion: v1\nkind: ServiceAccount\nmetadata:\n  name: x\nautomountServiceAccountToken: false\n")); err != nil {
		t.Errorf("valid document: %v", err)
	}
}
