package deploy

import (
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"
)

// The parts of Flux's GitRepository (source.toolkit.fluxcd.io/v1) and
// Kustomization (kustomize.toolkit.fluxcd.io/v1) the example uses; decoded
// strictly, so a field this test does not know fails it instead of passing
// unchecked.
type fluxMeta struct {
	Name      string `json:"name"`
	Namespace string `json:"namespace"`
}

type fluxGitRepository struct {
	APIVersion string   `json:"apiVersion"`
	Kind       string   `json:"kind"`
	Metadata   fluxMeta `json:"metadata"`
	Spec       struct {
		Interval string `json:"interval"`
		URL      string `json:"url"`
		Ref      struct {
			Tag string `json:"tag"`
		} `json:"ref"`
	} `json:"spec"`
}

type fluxKustomization struct {
	APIVersion string   `json:"apiVersion"`
	Kind       string   `json:"kind"`
	Metadata   fluxMeta `json:"metadata"`
	Spec       struct {
		DependsOn     []fluxMeta `json:"dependsOn"`
		Interval      string     `json:"interval"`
		RetryInterval string     `json:"retryInterval"`
		Timeout       string     `json:"timeout"`
		SourceRef     struct {
			Kind string `json:"kind"`
			Name string `json:"name"`
		} `json:"sourceRef"`
		Path  string `json:"path"`
		Prune bool   `json:"prune"`
		Wait  bool   `json:"wait"`
	} `json:"spec"`
}

// fluxExample is deploy/flux rendered with kustomize and decoded.
type fluxExample struct {
	Sources        []fluxGitRepository
	Kustomizations []fluxKustomization
}

func renderFlux(t *testing.T, dir string) fluxExample {
	t.Helper()
	out, err := kustomizeYAML(dir)
	if err != nil {
		t.Fatal(err)
	}
	var ex fluxExample
	for _, doc := range splitYAML(out) {
		var head struct {
			APIVersion string `json:"apiVersion"`
			Kind       string `json:"kind"`
		}
		if err := yaml.Unmarshal(doc, &head); err != nil {
			t.Fatal(err)
		}
		switch head.APIVersion + " " + head.Kind {
		case "source.toolkit.fluxcd.io/v1 GitRepository":
			var g fluxGitRepository
			if err := yaml.UnmarshalStrict(doc, &g); err != nil {
				t.Fatalf("%s: %v", dir, err)
			}
			ex.Sources = append(ex.Sources, g)
		case "kustomize.toolkit.fluxcd.io/v1 Kustomization":
			var k fluxKustomization
			if err := yaml.UnmarshalStrict(doc, &k); err != nil {
				t.Fatalf("%s: %v", dir, err)
			}
			ex.Kustomizations = append(ex.Kustomizations, k)
		default:
			t.Errorf("%s: %s %s: not a Flux object this example is meant to hold", dir, head.APIVersion, head.Kind)
		}
	}
	return ex
}

// fluxPath turns a Kustomization's spec.path, relative to the source's
// root (the repository), into a directory relative to deploy/.
func fluxPath(t *testing.T, p string) string {
	t.Helper()
	clean := path.Clean(strings.TrimPrefix(p, "./"))
	rel, ok := strings.CutPrefix(clean, "deploy/")
	if !ok || strings.HasPrefix(p, "/") {
		t.Fatalf("spec.path %q: not ./deploy/...", p)
	}
	return rel
}

// TestFluxExample renders deploy/flux and checks it holds together: every
// Kustomization's source exists and its path renders, dependsOn names
// Kustomizations of the example without a cycle, the migration comes first
// and is waited for, the two paths split the production overlay exactly,
// and the source is the release these manifests belong to.
func TestFluxExample(t *testing.T) {
	ex := renderFlux(t, "flux")
	if len(ex.Sources) != 1 || len(ex.Kustomizations) != 2 {
		t.Fatalf("deploy/flux: %d sources and %d Kustomizations, want 1 and 2 (the migration's and the daemons')", len(ex.Sources), len(ex.Kustomizations))
	}
	src := ex.Sources[0]
	version := strings.TrimSpace(readFile(t, "../VERSION"))
	if src.Spec.Ref.Tag != "v"+version {
		t.Errorf("GitRepository %s: ref.tag %q, want v%s (VERSION): the manifests of another release than the image they deploy", src.Metadata.Name, src.Spec.Ref.Tag, version)
	}
	if src.Spec.URL != "https://github.com/idemd/idemd" {
		t.Errorf("GitRepository %s: url %q", src.Metadata.Name, src.Spec.URL)
	}

	byName := map[string]fluxKustomization{}
	for _, k := range ex.Kustomizations {
		byName[k.Metadata.Name] = k
	}
	renders := map[string]*rendered{}
	for _, k := range ex.Kustomizations {
		if k.Spec.SourceRef.Kind != "GitRepository" || k.Spec.SourceRef.Name != src.Metadata.Name {
			t.Errorf("Kustomization %s: sourceRef %s/%s, not the example's GitRepository %s", k.Metadata.Name, k.Spec.SourceRef.Kind, k.Spec.SourceRef.Name, src.Metadata.Name)
		}
		if k.Metadata.Namespace != src.Metadata.Namespace {
			t.Errorf("Kustomization %s in %q, its source in %q: sourceRef names no namespace, so Flux looks in its own", k.Metadata.Name, k.Metadata.Namespace, src.Metadata.Namespace)
		}
		if !k.Spec.Prune || !k.Spec.Wait {
			t.Errorf("Kustomization %s: prune %v, wait %v: both must be on (readiness is what dependsOn waits for)", k.Metadata.Name, k.Spec.Prune, k.Spec.Wait)
		}
		for _, d := range k.Spec.DependsOn {
			if _, ok := byName[d.Name]; !ok || (d.Namespace != "" && d.Namespace != k.Metadata.Namespace) {
				t.Errorf("Kustomization %s dependsOn %s/%s, which the example does not hold", k.Metadata.Name, d.Namespace, d.Name)
			}
		}
		dir := fluxPath(t, k.Spec.Path)
		if _, err := os.Stat(filepath.Join(dir, "kustomization.yaml")); err != nil {
			t.Fatalf("Kustomization %s: path %s: %v", k.Metadata.Name, k.Spec.Path, err)
		}
		renders[k.Metadata.Name] = render(t, dir)
	}
	if cyc := dependsCycle(byName); cyc != "" {
		t.Errorf("dependsOn cycle: %s", cyc)
	}

	// Which one migrates: the one rendering the migration Job, alone.
	var migrate, daemons string
	for name, r := range renders {
		if _, ok := r.find("Job", "idemd-migrate"); ok {
			if migrate != "" {
				t.Fatalf("both %s and %s apply the migration Job", migrate, name)
			}
			migrate = name
		} else {
			daemons = name
		}
	}
	if migrate == "" || daemons == "" {
		t.Fatalf("no Kustomization applies the migration Job alone (migrate %q, daemons %q)", migrate, daemons)
	}
	if d := byName[daemons].Spec.DependsOn; len(d) != 1 || d[0].Name != migrate {
		t.Errorf("Kustomization %s dependsOn %v, want exactly %s: the daemons would roll before the migration completed", daemons, d, migrate)
	}
	if len(byName[migrate].Spec.DependsOn) != 0 {
		t.Errorf("Kustomization %s (the migration) dependsOn %v", migrate, byName[migrate].Spec.DependsOn)
	}
	if len(renders[daemons].byKind("Deployment")) == 0 {
		t.Errorf("Kustomization %s applies no Deployment", daemons)
	}

	// wait: true lasts at most the timeout; the Job may run its whole
	// activeDeadlineSeconds.
	jo, _ := renders[migrate].find("Job", "idemd-migrate")
	job := jo.Obj.(*batchv1.Job)
	timeout, err := time.ParseDuration(byName[migrate].Spec.Timeout)
	if err != nil {
		t.Fatalf("Kustomization %s: timeout: %v", migrate, err)
	}
	if job.Spec.ActiveDeadlineSeconds == nil || timeout < time.Duration(*job.Spec.ActiveDeadlineSeconds)*time.Second {
		t.Errorf("Kustomization %s: timeout %s, shorter than the Job's activeDeadlineSeconds %v: Flux gives up on a migration still within its deadline", migrate, timeout, job.Spec.ActiveDeadlineSeconds)
	}
	if job.Annotations["kustomize.toolkit.fluxcd.io/force"] != "enabled" {
		t.Errorf("Job idemd-migrate: no kustomize.toolkit.fluxcd.io/force: enabled: Flux cannot replace its immutable template at the next release")
	}

	// The Namespace holds the Secrets made by hand: Flux must never prune
	// it (a renamed Kustomization or a moved path would delete it and
	// them).
	for _, r := range renders {
		for _, ns := range r.byKind("Namespace") {
			m, ok := ns.Obj.(metav1.Object)
			if !ok || m.GetAnnotations()["kustomize.toolkit.fluxcd.io/prune"] != "disabled" {
				t.Errorf("Namespace %s: no kustomize.toolkit.fluxcd.io/prune: disabled: removing its Kustomization would delete the Secrets in it", ns.Name)
			}
		}
	}

	// Everything the Job reads is applied with it, in the Kustomization
	// the daemons wait for.
	refs := append(podRefs(&job.Spec.Template), argoRef{Kind: "Namespace", Name: jo.Namespace})
	refs = append(refs, selectingPolicies(renders[migrate], workload{jo, &job.Spec.Template})...)
	for _, ref := range refs {
		key := ref.Kind + "/" + ref.Name
		if _, ok := renders[migrate].find(ref.Kind, ref.Name); !ok && !argoExternal[key] {
			t.Errorf("Job idemd-migrate reads %s (%s), which %s does not apply", key, ref.Why, migrate)
		}
	}
	// A NetworkPolicy selecting the Job's pods only in the daemons' set
	// would not be in force while it runs.
	for _, p := range selectingPolicies(renders[daemons], workload{jo, &job.Spec.Template}) {
		t.Errorf("NetworkPolicy %s selects the migration's pods but is applied by %s, after it", p.Name, daemons)
	}

	// The two split the production overlay: each object in exactly one.
	whole := render(t, "overlays/production")
	count := map[string]int{}
	for _, r := range renders {
		for _, o := range r.Objects {
			count[o.String()]++
		}
	}
	for _, o := range whole.Objects {
		switch count[o.String()] {
		case 0:
			t.Errorf("%s: in overlays/production, applied by neither Kustomization", o)
		case 1:
		default:
			t.Errorf("%s: applied by both Kustomizations, which would fight over it", o)
		}
		delete(count, o.String())
	}
	for o := range count {
		t.Errorf("%s: applied by the example, not in overlays/production", o)
	}

	// Every workload of either finds what it reads, by its rendered name
	// (a generated ConfigMap's hash and all): deleting an object in one path
	// must not leave the other's references pointing at a name without it.
	for name, r := range renders {
		for _, w := range r.pods() {
			for _, ref := range podRefs(w.Pod) {
				key := ref.Kind + "/" + ref.Name
				_, inMigrate := renders[migrate].find(ref.Kind, ref.Name)
				_, inDaemons := renders[daemons].find(ref.Kind, ref.Name)
				if !inMigrate && !inDaemons && !ref.Optional && !argoExternal[key] {
					t.Errorf("%s (applied by %s) reads %s (%s), which neither Kustomization applies", w.Owner, name, key, ref.Why)
				}
			}
		}
	}

	// The kustomize binary operators run renders the example the same.
	if bin := kustomizeBinary(t); bin != nil {
		for _, dir := range []string{"flux", "flux/migrate", "flux/daemons"} {
			got := decodeFluxOrObjects(t, dir, bin(t, dir).yaml)
			lib, err := kustomizeYAML(dir)
			if err != nil {
				t.Fatal(err)
			}
			if want := decodeFluxOrObjects(t, dir, lib); !slices.Equal(got, want) {
				t.Errorf("%s: the kustomize binary renders %v, the library %v", dir, got, want)
			}
		}
	}
}

// decodeFluxOrObjects lists a rendering's objects as kind/name, sorted.
func decodeFluxOrObjects(t *testing.T, dir string, out []byte) []string {
	t.Helper()
	var names []string
	for _, doc := range splitYAML(out) {
		var m struct {
			Kind     string   `json:"kind"`
			Metadata fluxMeta `json:"metadata"`
		}
		if err := yaml.Unmarshal(doc, &m); err != nil {
			t.Fatalf("%s: %v", dir, err)
		}
		names = append(names, m.Kind+"/"+m.Metadata.Name)
	}
	slices.Sort(names)
	return names
}

// dependsCycle returns a dependsOn cycle among ks, as a path, or "".
func dependsCycle(ks map[string]fluxKustomization) string {
	state := map[string]int{} // 1 visiting, 2 done
	var walk func(name string, trail []string) string
	walk = func(name string, trail []string) string {
		switch state[name] {
		case 1:
			return strings.Join(append(trail, name), " -> ")
		case 2:
			return ""
		}
		state[name] = 1
		for _, d := range ks[name].Spec.DependsOn {
			if c := walk(d.Name, append(trail, name)); c != "" {
				return c
			}
		}
		state[name] = 2
		return ""
	}
	names := make([]string, 0, len(ks))
	for n := range ks {
		names = append(names, n)
	}
	slices.Sort(names)
	for _, n := range names {
		if c := walk(n, nil); c != "" {
			return c
		}
	}
	return ""
}
