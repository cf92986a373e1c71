package deploy

import (
	"net"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"sigs.k8s.io/yaml"
)

const pgbouncerComponent = "components/pgbouncer"

// overlayComponents lists the components an overlay's kustomization.yaml
// includes, relative to deploy/.
func overlayComponents(t *testing.T, dir string) []string {
	t.Helper()
	var k struct {
		Components []string `json:"components"`
	}
	if err := yaml.Unmarshal([]byte(readFile(t, filepath.Join(dir, "kustomization.yaml"))), &k); err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, c := range k.Components {
		out = append(out, path.Clean(path.Join(dir, c)))
	}
	return out
}

// TestPgBouncerComponent: an overlay with the pgbouncer component runs
// every container with --pooler transaction, gives the enqueuer its direct
// LISTEN URL from the Secret (a URL with a password never sits in a
// ConfigMap), and lets the pods reach the pooler's port; an overlay without
// it keeps the default (none). At least one overlay uses it, so the
// component is rendered and checked here.
func TestPgBouncerComponent(t *testing.T) {
	used := false
	for _, dir := range overlays {
		t.Run(dir, func(t *testing.T) {
			with := slices.Contains(overlayComponents(t, dir), pgbouncerComponent)
			used = used || with
			r := render(t, dir)
			for _, w := range r.workloads() {
				for i := range w.Pod.Spec.Containers {
					c := &w.Pod.Spec.Containers[i]
					got, ok := r.containerEnv(t, c)["IDEMD_POOLER"]
					switch {
					case with && got != "transaction":
						t.Errorf("%s: container %s: IDEMD_POOLER %q, want transaction", w, c.Name, got)
					case !with && ok && got != "none":
						t.Errorf("%s: container %s: IDEMD_POOLER %q without the pgbouncer component", w, c.Name, got)
					}
				}
			}
			o, ok := r.find("Deployment", "idemd-enqueuer")
			if !ok {
				t.Fatal("no Deployment idemd-enqueuer")
			}
			enq := container(o.Obj.(*appsv1.Deployment).Spec.Template.Spec.Containers, "enqueuer")
			var listen *corev1.EnvVar
			for i := range enq.Env {
				if enq.Env[i].Name == "IDEMD_LISTEN_DATABASE_URL" {
					listen = &enq.Env[i]
				}
			}
			if with {
				switch {
				case listen == nil:
					t.Error("the enqueuer has no IDEMD_LISTEN_DATABASE_URL: behind a transaction pooler it would only poll")
				case listen.ValueFrom == nil || listen.ValueFrom.SecretKeyRef == nil:
					t.Errorf("IDEMD_LISTEN_DATABASE_URL must come from a Secret (it holds a password): %+v", listen)
				default:
					ref := listen.ValueFrom.SecretKeyRef
					if _, ok := exampleSecretKeys(t, ref.Name)[ref.Key]; !ok {
						t.Errorf("IDEMD_LISTEN_DATABASE_URL reads Secret %s key %s, which secret.example.yaml does not document", ref.Name, ref.Key)
					}
				}
			} else if listen != nil {
				t.Errorf("IDEMD_LISTEN_DATABASE_URL set without the pgbouncer component: %+v", listen)
			}
			if got := egressPorts(r, "idemd-default"); with != slices.Contains(got, 6432) || !slices.Contains(got, 5432) {
				t.Errorf("idemd-default allows egress to ports %v; want 5432, and 6432 exactly when the pgbouncer component is used (%v)", got, with)
			}
		})
	}
	if !used {
		t.Errorf("no overlay uses %s: it is neither rendered nor checked", pgbouncerComponent)
	}
}

func egressPorts(r *rendered, policy string) []int {
	o, ok := r.find("NetworkPolicy", policy)
	if !ok {
		return nil
	}
	var ports []int
	for _, rule := range o.Obj.(*networkingv1.NetworkPolicy).Spec.Egress {
		for _, p := range rule.Ports {
			if p.Port != nil {
				ports = append(ports, p.Port.IntValue())
			}
		}
	}
	return ports
}

// TestConsoleDeployment: the console docs/console.md reaches with
// `kubectl port-forward deploy/idemd-console` exists in every overlay,
// listens on loopback only (its pages need no Service and nothing in the
// cluster may reach it), records no shared operator identity (one name for
// every person's action tells no one who acted), and shows the status page
// by the reaper's own retention.
func TestConsoleDeployment(t *testing.T) {
	for _, dir := range overlays {
		t.Run(dir, func(t *testing.T) {
			r := render(t, dir)
			o, ok := r.find("Deployment", "idemd-console")
			if !ok {
				t.Fatal("no Deployment idemd-console")
			}
			d := o.Obj.(*appsv1.Deployment)
			c := container(d.Spec.Template.Spec.Containers, "console")
			if c == nil {
				t.Fatal("no container console")
			}
			if !slices.Equal(c.Command, []string{"/usr/local/bin/idemctl"}) || len(c.Args) == 0 || c.Args[0] != "console" {
				t.Errorf("the console container runs %v %v, want idemctl console", c.Command, c.Args)
			}
			env := r.containerEnv(t, c)
			host, _, err := net.SplitHostPort(env["IDEMD_LISTEN"])
			if ip := net.ParseIP(host); err != nil || ip == nil || !ip.IsLoopback() {
				t.Errorf("IDEMD_LISTEN %q: the console must listen on loopback (reached by port-forward)", env["IDEMD_LISTEN"])
			}
			for _, name := range []string{"IDEMD_OPERATOR", "IDEMD_OPERATOR_HEADER"} {
				if v, ok := env[name]; ok {
					t.Errorf("%s=%q: the shared console records no identity of its own", name, v)
				}
			}
			rj, ok := r.find("CronJob", "idemd-reaper")
			if !ok {
				t.Fatal("no CronJob idemd-reaper")
			}
			reaper := r.containerEnv(t, &rj.Obj.(*batchv1.CronJob).Spec.JobTemplate.Spec.Template.Spec.Containers[0])
			if env["IDEMD_RETENTION"] == "" || env["IDEMD_RETENTION"] != reaper["IDEMD_RETENTION"] {
				t.Errorf("console IDEMD_RETENTION %q, reaper's %q: the status page would count keys past retention by another rule", env["IDEMD_RETENTION"], reaper["IDEMD_RETENTION"])
			}
			if env["DATABASE_URL"] == "" {
				t.Error("the console has no DATABASE_URL")
			}
			for _, s := range r.byKind("Service") {
				if sel := s.Obj.(*corev1.Service).Spec.Selector; sel["app.kubernetes.io/name"] == "console" {
					t.Errorf("%s exposes the console: it is reached by port-forward only", s)
				}
			}
		})
	}
}

// TestNoDaemonAutoscaler: no overlay scales the completer or the enqueuer
// by load. Each completer replica adds its own IDEMD_RATE of replays to
// the API (the API would get more replays exactly when it struggles), and
// a second enqueuer adds no throughput (docs/operations.md, "Autoscaling").
func TestNoDaemonAutoscaler(t *testing.T) {
	for _, dir := range overlays {
		r := render(t, dir)
		for _, o := range r.byKind("HorizontalPodAutoscaler") {
			ref := o.Obj.(*autoscalingv2.HorizontalPodAutoscaler).Spec.ScaleTargetRef
			if strings.HasPrefix(ref.Name, "idemd-") {
				t.Errorf("%s: %s scales %s %s", dir, o, ref.Kind, ref.Name)
			}
		}
	}
	// The guard has teeth: an HPA decodes, and names its target.
	o, err := decodeStrict([]byte("apiVersion: autoscaling/v2\nkind: HorizontalPodAutoscaler\nmetadata:\n  name: x\nspec:\n  scaleTargetRef:\n    apiVersion: apps/v1\n    kind: Deployment\n    name: idemd-completer\n  maxReplicas: 4\n"))
	if err != nil {
		t.Fatal(err)
	}
	if o.Obj.(*autoscalingv2.HorizontalPodAutoscaler).Spec.ScaleTargetRef.Name != "idemd-completer" {
		t.Error("an HPA's target did not decode")
	}
}
