package deploy

import (
	"fmt"
	"sort"
	"strconv"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
)

// Argo CD's ordering, as its documentation ("Sync Phases and Waves") and
// its sync engine (gitops-engine, pkg/sync) define it:
//
//   - an object with argocd.argoproj.io/hook is a hook of that phase
//     (PreSync, Sync, PostSync); every other object is applied in Sync;
//   - phases run in that order, and within a phase the waves
//     (argocd.argoproj.io/sync-wave, 0 by default, hooks included) run
//     lowest first; Argo CD applies a wave and waits until everything in it
//     is healthy (a Job: completed) before the next;
//   - a Namespace the manifests hold is applied like any other object, in
//     its phase and wave: CreateNamespace=true creates the namespace ahead
//     of the PreSync hooks only when the manifests do not hold it;
//   - a hook is not one of the application's resources: Argo CD deletes it
//     by its hook-delete-policy (BeforeHookCreation: at the next sync,
//     before creating it again; HookSucceeded, HookFailed: when the
//     operation ends) and never prunes or tracks it as part of the app.
const (
	argoHook       = "argocd.argoproj.io/hook"
	argoWave       = "argocd.argoproj.io/sync-wave"
	argoSyncOption = "argocd.argoproj.io/sync-options"
)

var argoPhases = map[string]int{"PreSync": 0, "Sync": 1, "PostSync": 2}

// argoStep is where an object is applied in a sync.
type argoStep struct {
	Phase string
	Wave  int
	Hook  bool
}

func (s argoStep) String() string {
	kind := "resource"
	if s.Hook {
		kind = "hook"
	}
	return fmt.Sprintf("%s %s wave %d", s.Phase, kind, s.Wave)
}

// before reports whether s is applied, and waited for, strictly before o.
func (s argoStep) before(o argoStep) bool {
	if argoPhases[s.Phase] != argoPhases[o.Phase] {
		return argoPhases[s.Phase] < argoPhases[o.Phase]
	}
	return s.Wave < o.Wave
}

// notAfter reports whether s is applied no later than o.
func (s argoStep) notAfter(o argoStep) bool { return !o.before(s) }

func stepOf(meta metav1.Object) (argoStep, error) {
	a := meta.GetAnnotations()
	s := argoStep{Phase: "Sync"}
	if h, ok := a[argoHook]; ok {
		if strings.Contains(h, ",") {
			return s, fmt.Errorf("hook %q: several phases: the check knows one", h)
		}
		if _, known := argoPhases[h]; !known {
			return s, fmt.Errorf("hook %q: not a phase this check orders", h)
		}
		s.Phase, s.Hook = h, true
	}
	if w, ok := a[argoWave]; ok {
		n, err := strconv.Atoi(w)
		if err != nil {
			return s, fmt.Errorf("sync-wave %q: %w", w, err)
		}
		s.Wave = n
	}
	return s, nil
}

// argoRef is one object a workload needs to exist when its pod starts.
type argoRef struct {
	Kind, Name string
	// Optional: the pod starts without it (optional: true).
	Optional bool
	// Why names the field that refers to it.
	Why string
}

// podRefs lists what a pod template refers to by name: its ServiceAccount,
// pull Secrets, volumes, envFrom and valueFrom of every container. The
// namespace and the NetworkPolicies selecting the pod are added by the
// caller, which knows the rendered objects.
func podRefs(p *corev1.PodTemplateSpec) []argoRef {
	var refs []argoRef
	add := func(kind, name string, optional *bool, why string) {
		refs = append(refs, argoRef{Kind: kind, Name: name, Optional: optional != nil && *optional, Why: why})
	}
	spec := &p.Spec
	if sa := spec.ServiceAccountName; sa != "" && sa != "default" {
		add("ServiceAccount", sa, nil, "serviceAccountName")
	}
	for _, s := range spec.ImagePullSecrets {
		add("Secret", s.Name, nil, "imagePullSecrets")
	}
	for _, v := range spec.Volumes {
		why := "volume " + v.Name
		switch {
		case v.ConfigMap != nil:
			add("ConfigMap", v.ConfigMap.Name, v.ConfigMap.Optional, why)
		case v.Secret != nil:
			add("Secret", v.Secret.SecretName, v.Secret.Optional, why)
		case v.PersistentVolumeClaim != nil:
			add("PersistentVolumeClaim", v.PersistentVolumeClaim.ClaimName, nil, why)
		case v.Projected != nil:
			for _, src := range v.Projected.Sources {
				if src.ConfigMap != nil {
					add("ConfigMap", src.ConfigMap.Name, src.ConfigMap.Optional, why)
				}
				if src.Secret != nil {
					add("Secret", src.Secret.Name, src.Secret.Optional, why)
				}
			}
		}
	}
	containers := append(append([]corev1.Container{}, spec.InitContainers...), spec.Containers...)
	for _, c := range containers {
		for _, from := range c.EnvFrom {
			if from.ConfigMapRef != nil {
				add("ConfigMap", from.ConfigMapRef.Name, from.ConfigMapRef.Optional, "container "+c.Name+" envFrom")
			}
			if from.SecretRef != nil {
				add("Secret", from.SecretRef.Name, from.SecretRef.Optional, "container "+c.Name+" envFrom")
			}
		}
		for _, e := range c.Env {
			if e.ValueFrom == nil {
				continue
			}
			why := "container " + c.Name + " env " + e.Name
			if r := e.ValueFrom.ConfigMapKeyRef; r != nil {
				add("ConfigMap", r.Name, r.Optional, why)
			}
			if r := e.ValueFrom.SecretKeyRef; r != nil {
				add("Secret", r.Name, r.Optional, why)
			}
		}
	}
	return refs
}

// argoExternal are the objects an operator creates before the first sync
// (docs/operations.md, "Deploy"): the overlays refer to them and do not
// hold them, so they exist before any phase.
var argoExternal = map[string]bool{
	"Secret/idemd-database":      true,
	"Secret/idemd-internal-auth": true,
}

// checkArgoOrder checks every pod-running object of r against the objects
// it needs, by Argo CD's ordering. Anything Argo CD waits for to finish (a
// hook, a Job) must find each of them applied in an earlier phase or wave:
// an object of the same wave is applied alongside it and one of a later
// step only after it has finished, which for a PreSync hook never comes.
// Anything else (a Deployment, a CronJob) may share its wave with what it
// needs, not come before it. A non-hook never needs a hook, which Argo CD
// deletes by its own policy and does not track as part of the app.
func checkArgoOrder(r *rendered) []string {
	var problems []string
	steps := map[string]argoStep{}
	for _, o := range r.Objects {
		m, ok := o.Obj.(metav1.Object)
		if !ok {
			problems = append(problems, fmt.Sprintf("%s: no object metadata", o))
			continue
		}
		s, err := stepOf(m)
		if err != nil {
			problems = append(problems, fmt.Sprintf("%s: %v", o, err))
			continue
		}
		steps[o.String()] = s
	}
	for _, w := range r.pods() {
		step, ok := steps[w.Owner.String()]
		if !ok {
			continue
		}
		_, isJob := w.Owner.Obj.(*batchv1.Job)
		mustFinish := step.Hook || isJob
		refs := podRefs(w.Pod)
		if ns := w.Owner.Namespace; ns != "" {
			refs = append(refs, argoRef{Kind: "Namespace", Name: ns, Why: "its namespace"})
		}
		refs = append(refs, selectingPolicies(r, w)...)
		for _, ref := range refs {
			key := ref.Kind + "/" + ref.Name
			dep, held := steps[key]
			if !held {
				// A namespace the manifests do not hold exists before the
				// sync (CreateNamespace=true, or the operator's).
				if ref.Kind != "Namespace" && !ref.Optional && !argoExternal[key] {
					problems = append(problems, fmt.Sprintf("%s (%s) needs %s (%s), which the manifests do not hold and nothing lists as created beforehand", w.Owner, step, key, ref.Why))
				}
				continue
			}
			switch {
			case dep.Hook && !step.Hook:
				problems = append(problems, fmt.Sprintf("%s (%s) needs %s (%s), a %s, which Argo CD deletes by its hook policy and does not keep as part of the app", w.Owner, step, key, ref.Why, dep))
			case mustFinish && !dep.before(step):
				problems = append(problems, fmt.Sprintf("%s (%s) must finish before the sync goes on, but needs %s (%s), applied only as a %s", w.Owner, step, key, ref.Why, dep))
			case !mustFinish && !dep.notAfter(step):
				problems = append(problems, fmt.Sprintf("%s (%s) needs %s (%s), applied later, as a %s", w.Owner, step, key, ref.Why, dep))
			}
		}
	}
	sort.Strings(problems)
	return problems
}

// selectingPolicies are the NetworkPolicies that select w's pods: they must
// be in force when the pod starts, or it runs unrestricted until they are.
func selectingPolicies(r *rendered, w workload) []argoRef {
	var refs []argoRef
	podLabels := labels.Set(w.Pod.Labels)
	for _, o := range r.byKind("NetworkPolicy") {
		np := o.Obj.(*networkingv1.NetworkPolicy)
		if np.Namespace != w.Owner.Namespace {
			continue
		}
		sel, err := metav1.LabelSelectorAsSelector(&np.Spec.PodSelector)
		if err != nil || !sel.Matches(podLabels) {
			continue
		}
		refs = append(refs, argoRef{Kind: "NetworkPolicy", Name: np.Name, Why: "selects its pods"})
	}
	return refs
}

// TestArgoCDOrder renders every overlay and checks that each hook and Job
// finds what it refers to already applied, by Argo CD's phases and waves:
// the migration Job must be able to start on a first sync and after any
// change of the configuration it reads.
func TestArgoCDOrder(t *testing.T) {
	for _, dir := range overlays {
		t.Run(dir, func(t *testing.T) {
			r := render(t, dir)
			for _, p := range checkArgoOrder(r) {
				t.Error(p)
			}
			// The check above passes vacuously for an overlay without the
			// migration Job; it must be there, and ordered.
			o, ok := r.find("Job", "idemd-migrate")
			if !ok {
				t.Fatalf("%s: no Job idemd-migrate", dir)
			}
			j := o.Obj.(*batchv1.Job)
			step, err := stepOf(j)
			if err != nil {
				t.Fatal(err)
			}
			for _, d := range r.byKind("Deployment") {
				ds, err := stepOf(d.Obj.(metav1.Object))
				if err != nil {
					t.Fatal(err)
				}
				if !step.before(ds) {
					t.Errorf("%s: Job idemd-migrate (%s) does not finish before %s (%s) rolls", dir, step, d, ds)
				}
			}
		})
	}
}

// TestArgoCDOrderCheck feeds the check objects whose order is known, so a
// check that cannot fail does not pass for one that holds.
func TestArgoCDOrderCheck(t *testing.T) {
	ns := "idemd"
	meta := func(name string, ann map[string]string) metav1.ObjectMeta {
		return metav1.ObjectMeta{Name: name, Namespace: ns, Annotations: ann, Labels: map[string]string{"app.kubernetes.io/part-of": "idemd"}}
	}
	job := func(ann map[string]string) object {
		j := &batchv1.Job{ObjectMeta: meta("migrate", ann)}
		j.Spec.Template.Labels = map[string]string{"app.kubernetes.io/part-of": "idemd"}
		j.Spec.Template.Spec.ServiceAccountName = "sa"
		j.Spec.Template.Spec.Containers = []corev1.Container{{
			Name:    "migrate",
			EnvFrom: []corev1.EnvFromSource{{ConfigMapRef: &corev1.ConfigMapEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: "cm"}}}},
		}}
		return object{Kind: "Job", Name: "migrate", Namespace: ns, Obj: j}
	}
	cm := func(ann map[string]string) object {
		return object{Kind: "ConfigMap", Name: "cm", Namespace: ns, Obj: &corev1.ConfigMap{ObjectMeta: meta("cm", ann)}}
	}
	sa := func(ann map[string]string) object {
		return object{Kind: "ServiceAccount", Name: "sa", Namespace: ns, Obj: &corev1.ServiceAccount{ObjectMeta: meta("sa", ann)}}
	}
	namespace := func(ann map[string]string) object {
		return object{Kind: "Namespace", Name: ns, Obj: &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns, Annotations: ann}}}
	}
	policy := func(ann map[string]string) object {
		np := &networkingv1.NetworkPolicy{ObjectMeta: meta("np", ann)}
		np.Spec.PodSelector.MatchLabels = map[string]string{"app.kubernetes.io/part-of": "idemd"}
		return object{Kind: "NetworkPolicy", Name: "np", Namespace: ns, Obj: np}
	}
	preSync := map[string]string{argoHook: "PreSync"}
	preSyncEarly := map[string]string{argoHook: "PreSync", argoWave: "-1"}
	wave := func(w string) map[string]string { return map[string]string{argoWave: w} }
	cases := []struct {
		name    string
		objects []object
		want    []string // substrings, one problem each; none: holds
	}{
		{"presync job, sync config (today's overlay)",
			[]object{job(preSync), cm(nil), sa(nil)},
			[]string{"needs ConfigMap/cm", "needs ServiceAccount/sa"}},
		{"presync job in a namespace the manifests create in sync",
			[]object{job(preSync), cm(preSyncEarly), sa(preSyncEarly), namespace(nil)},
			[]string{"needs Namespace/idemd"}},
		{"presync job, presync config of the same wave",
			[]object{job(preSync), cm(preSync), sa(preSyncEarly)},
			[]string{"needs ConfigMap/cm"}},
		{"presync job, presync config of an earlier wave",
			[]object{job(preSync), cm(preSyncEarly), sa(preSyncEarly)},
			nil},
		{"job in wave -1, config and namespace in wave -2",
			[]object{job(wave("-1")), cm(wave("-2")), sa(wave("-2")), namespace(wave("-2")), policy(wave("-2"))},
			nil},
		{"job in wave -1, the policy selecting it in wave 0",
			[]object{job(wave("-1")), cm(wave("-2")), sa(wave("-2")), policy(nil)},
			[]string{"needs NetworkPolicy/np"}},
		{"job in wave 0 beside its config",
			[]object{job(nil), cm(nil), sa(wave("-1"))},
			[]string{"needs ConfigMap/cm"}},
		{"job needing a ConfigMap nobody creates",
			[]object{job(wave("-1")), sa(wave("-2"))},
			[]string{"ConfigMap/cm"}},
		{"a wave that is not a number",
			[]object{job(wave("first")), cm(wave("-2")), sa(wave("-2"))},
			[]string{"sync-wave"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := checkArgoOrder(&rendered{Dir: "synthetic", Objects: c.objects})
			if len(got) != len(c.want) {
				t.Fatalf("problems %q, want %d matching %q", got, len(c.want), c.want)
			}
			for _, w := range c.want {
				found := false
				for _, p := range got {
					if strings.Contains(p, w) {
						found = true
					}
				}
				if !found {
					t.Errorf("problems %q: none mentions %q", got, w)
				}
			}
		})
	}
	// A Deployment needing a hook: the hook is deleted by its policy.
	d := deploymentNeeding("cm", ns)
	got := checkArgoOrder(&rendered{Objects: []object{d, cm(preSync)}})
	if len(got) != 1 || !strings.Contains(got[0], "hook policy") {
		t.Errorf("a Deployment reading a hook ConfigMap: problems %q", got)
	}
}

func deploymentNeeding(configMap, ns string) object {
	d := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: "daemon", Namespace: ns}}
	d.Spec.Template.Spec.Volumes = []corev1.Volume{{
		Name:         "config",
		VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: configMap}}},
	}}
	return object{Kind: "Deployment", Name: "daemon", Namespace: ns, Obj: d}
}
