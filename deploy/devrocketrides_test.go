package deploy

import (
	"net/url"
	"path"
	"regexp"
	"strconv"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// clusterHost matches an in-cluster Service address, <service>.<namespace>.svc.cluster.local[:port].
var clusterHost = regexp.MustCompile(`([a-z0-9-]+)\.([a-z0-9-]+)\.svc\.cluster\.local(?::([0-9]+))?`)

// TestDevOverlayRocketRides: the dev overlay runs the API the completer
// replays to. Rocket Rides runs from the image `make image` builds; every
// Service any rendered ConfigMap, Secret or container environment names
// (the completer's IDEMD_API_URL, the database URLs) is rendered in the
// namespace named, on the port named, and selects a rendered pod that
// exposes its target port; Rocket Rides verifies replays with the very
// Secret keys the completer signs with; its database URL carries the
// PostgreSQL's password; and the network policies let the completer reach
// it and it reach the database.
func TestDevOverlayRocketRides(t *testing.T) {
	const dir = "overlays/dev"
	r := render(t, dir)

	o, ok := r.find("Deployment", "rocketrides")
	if !ok {
		t.Fatal("the dev overlay renders no Deployment rocketrides")
	}
	rr := o.Obj.(*appsv1.Deployment)
	rrc := &rr.Spec.Template.Spec.Containers[0]
	if want := makeImage(t); rrc.Image != want {
		t.Errorf("rocketrides runs %s, `make image` builds %s", rrc.Image, want)
	}
	if want := []string{"/usr/local/bin/rocketrides"}; strings.Join(rrc.Command, " ") != want[0] {
		t.Errorf("rocketrides runs %v, want %v", rrc.Command, want)
	}
	rrEnv := resolvedEnv(t, r, rrc)

	// Every Service named anywhere is rendered and serves the port named.
	var values []string
	for _, kind := range []string{"ConfigMap", "Secret"} {
		for _, o := range r.byKind(kind) {
			data, _ := r.configData(kind, o.Name)
			for _, v := range data {
				values = append(values, v)
			}
		}
	}
	for _, w := range r.pods() {
		for i := range w.Pod.Spec.Containers {
			for _, v := range resolvedEnv(t, r, &w.Pod.Spec.Containers[i]) {
				values = append(values, v)
			}
		}
	}
	named := map[string]bool{}
	for _, v := range values {
		for _, m := range clusterHost.FindAllStringSubmatch(v, -1) {
			named[m[0]] = true
			checkServiceReference(t, r, m[1], m[2], m[3])
		}
	}
	for _, want := range []string{"rocketrides.idemd-dev.svc.cluster.local:8080", "postgres.idemd-dev.svc.cluster.local:5432"} {
		if !named[want] {
			t.Errorf("nothing in the render names %s", want)
		}
	}

	// The completer replays to Rocket Rides.
	co, ok := r.find("Deployment", "idemd-completer")
	if !ok {
		t.Fatal("no Deployment idemd-completer")
	}
	comp := co.Obj.(*appsv1.Deployment)
	cc := &comp.Spec.Template.Spec.Containers[0]
	compEnv := resolvedEnv(t, r, cc)
	u, err := url.Parse(compEnv["IDEMD_API_URL"])
	if err != nil || u.Host != "rocketrides.idemd-dev.svc.cluster.local:8080" {
		t.Errorf("the completer's IDEMD_API_URL %q is not the rendered Service rocketrides (%v)", compEnv["IDEMD_API_URL"], err)
	}

	// The replay secret: the completer's keys are the ones Rocket Rides
	// verifies with, file by file.
	for compVar, rrVar := range map[string]string{
		"IDEMD_AUTH_SECRET_FILE":          "IDEMD_REPLAY_SECRET_FILE",
		"IDEMD_AUTH_SECRET_FILE_PREVIOUS": "IDEMD_REPLAY_SECRET_FILE_PREVIOUS",
	} {
		cs, ck := mountedSecretKey(t, &comp.Spec.Template.Spec, cc, compEnv[compVar])
		rs, rk := mountedSecretKey(t, &rr.Spec.Template.Spec, rrc, rrEnv[rrVar])
		if cs == "" || cs != rs || ck != rk {
			t.Errorf("the completer's %s is Secret %q key %q, Rocket Rides' %s is Secret %q key %q", compVar, cs, ck, rrVar, rs, rk)
		}
		if data, ok := r.configData("Secret", cs); !ok || data[ck] == "" {
			t.Errorf("%s: Secret %q key %q is not rendered", compVar, cs, ck)
		}
	}

	// Its database: the rendered PostgreSQL, with its superuser's password.
	pgSecret, _ := r.configData("Secret", "postgres")
	if len(pgSecret) == 0 {
		for _, o := range r.byKind("Secret") {
			if strings.HasPrefix(o.Name, "postgres-") {
				pgSecret, _ = r.configData("Secret", o.Name)
			}
		}
	}
	du, err := url.Parse(rrEnv["DATABASE_URL"])
	if err != nil || du.User == nil {
		t.Fatalf("Rocket Rides' DATABASE_URL %q does not parse with a user: %v", rrEnv["DATABASE_URL"], err)
	}
	if pw, _ := du.User.Password(); du.User.Username() != "postgres" || pw == "" || pw != pgSecret["POSTGRES_PASSWORD"] {
		t.Errorf("Rocket Rides logs in as %s with a password other than the PostgreSQL's POSTGRES_PASSWORD", du.User.Username())
	}
	if du.Host != "postgres.idemd-dev.svc.cluster.local:5432" || du.Path != "/idemd" {
		t.Errorf("Rocket Rides' database is %s%s, want idemd's database on the rendered PostgreSQL", du.Host, du.Path)
	}

	// The network policies let the traffic through.
	pg := mustFind[*appsv1.StatefulSet](t, r, "StatefulSet", "postgres")
	if !policiesAllow(r, comp.Spec.Template.Labels, rr.Spec.Template.Labels, 8080, "http") {
		t.Error("the NetworkPolicies do not let the completer reach Rocket Rides on 8080")
	}
	if !policiesAllow(r, rr.Spec.Template.Labels, pg.Spec.Template.Labels, 5432, "postgres") {
		t.Error("the NetworkPolicies do not let Rocket Rides reach the PostgreSQL on 5432")
	}
	// The check can fail: nothing lets Rocket Rides reach the completer.
	if policiesAllow(r, rr.Spec.Template.Labels, comp.Spec.Template.Labels, 9090, "metrics") {
		t.Error("the policy check lets Rocket Rides reach the completer's metrics port: it proves nothing")
	}
}

func mustFind[T any](t *testing.T, r *rendered, kind, name string) T {
	t.Helper()
	o, ok := r.find(kind, name)
	if !ok {
		t.Fatalf("%s renders no %s %s", r.Dir, kind, name)
	}
	return o.Obj.(T)
}

// resolvedEnv is containerEnv with the values of rendered Secrets filled in.
func resolvedEnv(t *testing.T, r *rendered, c *corev1.Container) map[string]string {
	t.Helper()
	env := r.containerEnv(t, c)
	for _, e := range c.Env {
		if e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil {
			if data, ok := r.configData("Secret", e.ValueFrom.SecretKeyRef.Name); ok {
				env[e.Name] = data[e.ValueFrom.SecretKeyRef.Key]
			}
		}
	}
	return env
}

// mountedSecretKey returns the Secret and key a file path of container c
// reads, through a volume mount of a whole Secret.
func mountedSecretKey(t *testing.T, spec *corev1.PodSpec, c *corev1.Container, file string) (secret, key string) {
	t.Helper()
	for _, m := range c.VolumeMounts {
		if path.Dir(file) != path.Clean(m.MountPath) {
			continue
		}
		for _, v := range spec.Volumes {
			if v.Name == m.Name && v.Secret != nil {
				return v.Secret.SecretName, path.Base(file)
			}
		}
	}
	t.Errorf("container %s: %q is in no mounted Secret", c.Name, file)
	return "", ""
}

// checkServiceReference: Service name in namespace ns is rendered, has
// port (if given), and selects a rendered pod whose container exposes the
// port's target.
func checkServiceReference(t *testing.T, r *rendered, name, ns, port string) {
	t.Helper()
	var svc *corev1.Service
	for _, o := range r.byKind("Service") {
		if o.Name == name && o.Namespace == ns {
			svc = o.Obj.(*corev1.Service)
		}
	}
	if svc == nil {
		t.Errorf("%s.%s is named but no Service %s is rendered in namespace %s", name, ns, name, ns)
		return
	}
	var sp *corev1.ServicePort
	for i := range svc.Spec.Ports {
		if port == "" || strconv.Itoa(int(svc.Spec.Ports[i].Port)) == port {
			sp = &svc.Spec.Ports[i]
		}
	}
	if sp == nil {
		t.Errorf("Service %s has no port %s", name, port)
		return
	}
	for _, w := range r.pods() {
		if w.Owner.Namespace != ns || len(svc.Spec.Selector) == 0 || !subset(svc.Spec.Selector, w.Pod.Labels) {
			continue
		}
		for _, c := range w.Pod.Spec.Containers {
			for _, cp := range c.Ports {
				if (sp.TargetPort.Type == intstr.String && cp.Name == sp.TargetPort.StrVal) ||
					(sp.TargetPort.Type == intstr.Int && cp.ContainerPort == sp.TargetPort.IntVal) {
					return
				}
			}
		}
	}
	t.Errorf("Service %s port %d selects no rendered pod exposing %s", name, sp.Port, sp.TargetPort.String())
}

func subset(sel, labels map[string]string) bool {
	for k, v := range sel {
		if labels[k] != v {
			return false
		}
	}
	return true
}

// policiesAllow reports whether the NetworkPolicies of the render let a
// pod labelled from connect to a pod labelled to, in the same namespace, on
// port (number or the target's port name). Policies add up: a direction no
// policy selects the pod for is open; otherwise one rule of one selecting
// policy must allow the connection.
func policiesAllow(r *rendered, from, to map[string]string, port int32, portName string) bool {
	peerOK := func(peers []networkingv1.NetworkPolicyPeer, labels map[string]string) bool {
		if len(peers) == 0 {
			return true
		}
		for _, p := range peers {
			if p.NamespaceSelector == nil && p.IPBlock == nil && p.PodSelector != nil && subset(p.PodSelector.MatchLabels, labels) {
				return true
			}
		}
		return false
	}
	portOK := func(ports []networkingv1.NetworkPolicyPort) bool {
		if len(ports) == 0 {
			return true
		}
		for _, p := range ports {
			if p.Port == nil || (p.Port.Type == intstr.Int && p.Port.IntVal == port) || (p.Port.Type == intstr.String && p.Port.StrVal == portName) {
				return true
			}
		}
		return false
	}
	var egressSelected, egressAllowed, ingressSelected, ingressAllowed bool
	for _, o := range r.byKind("NetworkPolicy") {
		np := o.Obj.(*networkingv1.NetworkPolicy)
		for _, pt := range np.Spec.PolicyTypes {
			switch {
			case pt == networkingv1.PolicyTypeEgress && subset(np.Spec.PodSelector.MatchLabels, from):
				egressSelected = true
				for _, e := range np.Spec.Egress {
					egressAllowed = egressAllowed || (peerOK(e.To, to) && portOK(e.Ports))
				}
			case pt == networkingv1.PolicyTypeIngress && subset(np.Spec.PodSelector.MatchLabels, to):
				ingressSelected = true
				for _, i := range np.Spec.Ingress {
					ingressAllowed = ingressAllowed || (peerOK(i.From, from) && portOK(i.Ports))
				}
			}
		}
	}
	return (!egressSelected || egressAllowed) && (!ingressSelected || ingressAllowed)
}
