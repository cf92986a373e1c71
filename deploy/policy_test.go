package deploy

import (
	"fmt"
	"net"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
	psaapi "k8s.io/pod-security-admission/api"
	psapolicy "k8s.io/pod-security-admission/policy"
)

// The daemons' own shutdown bound (--shutdown-timeout default) and the ops
// server's stop timeout after it (internal/daemon), which together must fit
// inside terminationGracePeriodSeconds.
const (
	defaultShutdownTimeout = 20 * time.Second
	opsServerStopTimeout   = 5 * time.Second
)

// daemons are the long-running Deployments, by container name.
var daemons = []string{"enqueuer", "completer"}

// TestOverlaysRenderStrictly renders and decodes every kustomization. With
// DEPLOY_CHECK_OUT set (scripts/deploy-check.sh) it also writes each
// rendering there, for a reader without kubectl.
func TestOverlaysRenderStrictly(t *testing.T) {
	for _, dir := range append(slices.Clone(overlays), "observability") {
		t.Run(dir, func(t *testing.T) {
			r := render(t, dir)
			for _, o := range r.Objects {
				t.Logf("%s", o)
			}
			if out := os.Getenv("DEPLOY_CHECK_OUT"); out != "" {
				b, err := kustomizeYAML(dir)
				if err != nil {
					t.Fatal(err)
				}
				name := "go-" + strings.ReplaceAll(dir, "/", "-") + ".yaml"
				if err := os.WriteFile(filepath.Join(out, name), b, 0o644); err != nil {
					t.Fatal(err)
				}
			}
		})
	}
}

func TestSecretExampleDecodesStrictly(t *testing.T) {
	for _, name := range []string{"idemd-database", "idemd-internal-auth"} {
		if keys := exampleSecretKeys(t, name); len(keys) == 0 {
			t.Errorf("base/secret.example.yaml documents no keys for Secret %s", name)
		}
	}
}

// TestPodSecurity: every pod the manifests render (Deployments, CronJobs,
// Jobs) is admitted by the official Pod Security evaluator
// (k8s.io/pod-security-admission) at the level and version the Namespace
// enforces, which must be restricted; then the project's own rules that the
// standard does not cover.
func TestPodSecurity(t *testing.T) {
	for _, dir := range overlays {
		t.Run(dir, func(t *testing.T) {
			r := render(t, dir)
			nss := r.byKind("Namespace")
			if len(nss) != 1 {
				t.Fatalf("want exactly one Namespace, got %d", len(nss))
			}
			ns := nss[0].Obj.(*corev1.Namespace)
			lv := enforcedLevel(t, ns)
			for _, o := range r.Objects {
				if o.Kind != "Namespace" && o.Namespace != ns.Name {
					t.Errorf("%s is in namespace %q, want %q", o, o.Namespace, ns.Name)
				}
			}
			sas := map[string]*corev1.ServiceAccount{}
			for _, o := range r.byKind("ServiceAccount") {
				sa := o.Obj.(*corev1.ServiceAccount)
				sas[sa.Name] = sa
				if sa.AutomountServiceAccountToken == nil || *sa.AutomountServiceAccountToken {
					t.Errorf("ServiceAccount %s: automountServiceAccountToken must be false", sa.Name)
				}
			}
			ws := r.pods()
			if len(ws) == 0 {
				t.Fatal("no workloads rendered")
			}
			for _, w := range ws {
				if why := podSecurityViolations(lv, w.Pod); why != "" {
					t.Errorf("%s: refused by Pod Security %s: %s", w, lv, why)
				}
				checkProjectPodRules(t, w, sas)
			}
		})
	}
}

// podSecurity is the evaluator the kube-apiserver's PodSecurity admission
// runs, with its default checks.
var podSecurity = sync.OnceValues(func() (psapolicy.Evaluator, error) {
	return psapolicy.NewEvaluator(psapolicy.DefaultChecks(), nil)
})

// enforcedLevel reads the Namespace's pod-security.kubernetes.io/enforce
// labels as the admission controller does; the project requires restricted.
func enforcedLevel(t *testing.T, ns *corev1.Namespace) psaapi.LevelVersion {
	t.Helper()
	level, err := psaapi.ParseLevel(ns.Labels[psaapi.EnforceLevelLabel])
	if err != nil {
		t.Errorf("Namespace %s: %s = %q: %v", ns.Name, psaapi.EnforceLevelLabel, ns.Labels[psaapi.EnforceLevelLabel], err)
	}
	if level != psaapi.LevelRestricted {
		t.Errorf("Namespace %s: %s = %q, want restricted", ns.Name, psaapi.EnforceLevelLabel, level)
	}
	version := psaapi.LatestVersion()
	if v, ok := ns.Labels[psaapi.EnforceVersionLabel]; ok {
		if version, err = psaapi.ParseVersion(v); err != nil {
			t.Errorf("Namespace %s: %s = %q: %v", ns.Name, psaapi.EnforceVersionLabel, v, err)
		}
	}
	// The evaluation is always at restricted: a Namespace asking for less
	// has already failed above and must not weaken the pod checks.
	return psaapi.LevelVersion{Level: psaapi.LevelRestricted, Version: version}
}

// podSecurityViolations returns why the evaluator refuses pod at lv
// (empty: admitted).
func podSecurityViolations(lv psaapi.LevelVersion, pod *corev1.PodTemplateSpec) string {
	ev, err := podSecurity()
	if err != nil {
		return "evaluator: " + err.Error()
	}
	res := psapolicy.AggregateCheckResults(ev.EvaluatePod(lv, &pod.ObjectMeta, &pod.Spec))
	if res.Allowed {
		return ""
	}
	return res.ForbiddenDetail()
}

// TestPodSecurityRefusesNonCompliantPods proves the evaluator above has
// teeth: each deliberately broken copy of a rendered pod is refused, for the
// reason the standard gives.
func TestPodSecurityRefusesNonCompliantPods(t *testing.T) {
	r := render(t, "base")
	o, ok := r.find("Deployment", "idemd-enqueuer")
	if !ok {
		t.Fatal("no Deployment idemd-enqueuer")
	}
	good := &o.Obj.(*appsv1.Deployment).Spec.Template
	lv := psaapi.LevelVersion{Level: psaapi.LevelRestricted, Version: psaapi.LatestVersion()}
	if why := podSecurityViolations(lv, good); why != "" {
		t.Fatalf("the unmodified pod is refused: %s", why)
	}
	yes, no := true, false
	root := int64(0)
	for _, tc := range []struct {
		name   string
		break_ func(*corev1.PodSpec)
		reason string // part of the evaluator's ForbiddenReason
	}{
		{"privileged", func(s *corev1.PodSpec) { s.Containers[0].SecurityContext.Privileged = &yes }, "privileged"},
		{"runAsNonRoot false", func(s *corev1.PodSpec) {
			s.SecurityContext.RunAsNonRoot = &no
			s.Containers[0].SecurityContext.RunAsNonRoot = nil
		}, "runAsNonRoot"},
		{"runAsUser 0", func(s *corev1.PodSpec) { s.Containers[0].SecurityContext.RunAsUser = &root }, "runAsUser=0"},
		{"privilege escalation", func(s *corev1.PodSpec) { s.Containers[0].SecurityContext.AllowPrivilegeEscalation = &yes }, "allowPrivilegeEscalation"},
		{"capabilities not dropped", func(s *corev1.PodSpec) { s.Containers[0].SecurityContext.Capabilities = nil }, "capabilities"},
		{"capability added", func(s *corev1.PodSpec) {
			s.Containers[0].SecurityContext.Capabilities.Add = []corev1.Capability{"NET_ADMIN"}
		}, "capabilities"},
		{"no seccomp profile", func(s *corev1.PodSpec) {
			s.SecurityContext.SeccompProfile = nil
			s.Containers[0].SecurityContext.SeccompProfile = nil
		}, "seccompProfile"},
		{"host network", func(s *corev1.PodSpec) { s.HostNetwork = true }, "host namespaces"},
		{"hostPath volume", func(s *corev1.PodSpec) {
			s.Volumes = append(s.Volumes, corev1.Volume{Name: "host", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/"}}})
		}, "hostPath"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			bad := good.DeepCopy()
			if bad.Spec.SecurityContext == nil || bad.Spec.Containers[0].SecurityContext == nil {
				t.Fatal("the rendered pod has no securityContext to break")
			}
			tc.break_(&bad.Spec)
			why := podSecurityViolations(lv, bad)
			if why == "" {
				t.Fatalf("the evaluator admitted a pod with %s", tc.name)
			}
			if !strings.Contains(why, tc.reason) {
				t.Errorf("refused for %q, want a reason containing %q", why, tc.reason)
			}
		})
	}
}

// checkProjectPodRules are the project's rules the Pod Security Standards
// do not cover: a real ServiceAccount without a token, no service links (a
// Service's env vars would be read as IDEMD_* flags), a read-only root
// filesystem, no added capabilities at all (restricted still allows
// NET_BIND_SERVICE; the daemons listen on 9090), resources and pinned
// images.
func checkProjectPodRules(t *testing.T, w workload, sas map[string]*corev1.ServiceAccount) {
	t.Helper()
	spec := &w.Pod.Spec
	if spec.ServiceAccountName == "" || sas[spec.ServiceAccountName] == nil {
		t.Errorf("%s: serviceAccountName %q is not a rendered ServiceAccount", w, spec.ServiceAccountName)
	}
	if spec.AutomountServiceAccountToken == nil || *spec.AutomountServiceAccountToken {
		t.Errorf("%s: automountServiceAccountToken must be false on the pod too", w)
	}
	if spec.EnableServiceLinks == nil || *spec.EnableServiceLinks {
		t.Errorf("%s: enableServiceLinks must be false (service env vars named IDEMD_* would be read as flags)", w)
	}
	all := append(slices.Clone(spec.InitContainers), spec.Containers...)
	for _, c := range all {
		sc := c.SecurityContext
		if sc == nil || !isTrue(sc.ReadOnlyRootFilesystem) {
			t.Errorf("%s: container %s: readOnlyRootFilesystem must be true", w, c.Name)
		}
		if sc != nil && sc.Capabilities != nil && len(sc.Capabilities.Add) > 0 {
			t.Errorf("%s: container %s adds capabilities %v", w, c.Name, sc.Capabilities.Add)
		}
		checkResources(t, w, c)
		checkImage(t, w, c)
	}
}

func checkResources(t *testing.T, w workload, c corev1.Container) {
	t.Helper()
	for _, res := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
		if _, ok := c.Resources.Requests[res]; !ok {
			t.Errorf("%s: container %s has no %s request", w, c.Name, res)
		}
	}
	// A memory limit, so a leak kills one pod rather than its node; no CPU
	// limit, so a batch is not throttled while the node has idle cores.
	if _, ok := c.Resources.Limits[corev1.ResourceMemory]; !ok {
		t.Errorf("%s: container %s has no memory limit", w, c.Name)
	}
}

func checkImage(t *testing.T, w workload, c corev1.Container) {
	t.Helper()
	ref := c.Image
	digest := ""
	if i := strings.Index(ref, "@"); i >= 0 {
		ref, digest = ref[:i], ref[i+1:]
	}
	tag := ""
	if i := strings.LastIndex(ref, ":"); i > strings.LastIndex(ref, "/") {
		ref, tag = ref[:i], ref[i+1:]
	}
	switch {
	case tag == "" && digest == "":
		t.Errorf("%s: container %s: image %q has no tag or digest (means :latest)", w, c.Name, c.Image)
	case tag == "latest":
		t.Errorf("%s: container %s: image %q uses the latest tag", w, c.Name, c.Image)
	}
	if !strings.Contains(ref, "/") {
		t.Errorf("%s: container %s: image %q was not rewritten by the kustomization's images", w, c.Name, c.Image)
	}
	if c.ImagePullPolicy == corev1.PullAlways {
		t.Errorf("%s: container %s: imagePullPolicy Always with a pinned tag only adds a registry dependency", w, c.Name)
	}
}

func TestDaemonDeployments(t *testing.T) {
	for _, dir := range overlays {
		t.Run(dir, func(t *testing.T) {
			r := render(t, dir)
			for _, name := range daemons {
				o, ok := r.find("Deployment", "idemd-"+name)
				if !ok {
					t.Errorf("no Deployment idemd-%s", name)
					continue
				}
				d := o.Obj.(*appsv1.Deployment)
				c := container(d.Spec.Template.Spec.Containers, name)
				if c == nil {
					t.Errorf("%s: no container %s", o, name)
					continue
				}
				env := r.containerEnv(t, c)
				checkProbes(t, o, c, env)
				checkGracePeriod(t, o, d.Spec.Template.Spec.TerminationGracePeriodSeconds, env)
				checkPDB(t, r, o, d)
				checkNetworkPolicies(t, r, o, d.Spec.Template.Labels)
			}
			if dir != "overlays/dev" {
				o, _ := r.find("Deployment", "idemd-enqueuer")
				if d, ok := o.Obj.(*appsv1.Deployment); ok && (d.Spec.Replicas == nil || *d.Spec.Replicas < 2) {
					t.Errorf("%s: the enqueuer runs at least 2 replicas outside dev", o)
				}
			}
		})
	}
}

func container(cs []corev1.Container, name string) *corev1.Container {
	for i := range cs {
		if cs[i].Name == name {
			return &cs[i]
		}
	}
	return nil
}

// checkProbes: readiness on /readyz, liveness on /healthz, both on the port
// the ops server listens on (IDEMD_HTTP_ADDR, default :9090).
func checkProbes(t *testing.T, o object, c *corev1.Container, env map[string]string) {
	t.Helper()
	addr := ":9090"
	if v, ok := env["IDEMD_HTTP_ADDR"]; ok {
		addr = v
	}
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		t.Errorf("%s: IDEMD_HTTP_ADDR %q: %v", o, addr, err)
		return
	}
	for _, p := range []struct {
		name  string
		probe *corev1.Probe
		path  string
	}{
		{"readinessProbe", c.ReadinessProbe, "/readyz"},
		{"livenessProbe", c.LivenessProbe, "/healthz"},
	} {
		if p.probe == nil || p.probe.HTTPGet == nil {
			t.Errorf("%s: container %s has no HTTP %s", o, c.Name, p.name)
			continue
		}
		if p.probe.HTTPGet.Path != p.path {
			t.Errorf("%s: %s path %q, want %q", o, p.name, p.probe.HTTPGet.Path, p.path)
		}
		if got := resolvePort(c, p.probe.HTTPGet.Port); got != port {
			t.Errorf("%s: %s on port %q, but the ops server listens on %q", o, p.name, got, port)
		}
	}
	metrics := false
	for _, cp := range c.Ports {
		if cp.Name == "metrics" && fmt.Sprint(cp.ContainerPort) == port {
			metrics = true
		}
	}
	if !metrics {
		t.Errorf("%s: container %s must name its ops port %s \"metrics\" (PodMonitor and NetworkPolicy use the name)", o, c.Name, port)
	}
}

func resolvePort(c *corev1.Container, p intstr.IntOrString) string {
	if p.Type == intstr.Int {
		return p.String()
	}
	for _, cp := range c.Ports {
		if cp.Name == p.StrVal {
			return fmt.Sprint(cp.ContainerPort)
		}
	}
	return "unresolved:" + p.StrVal
}

// checkGracePeriod: the kubelet's SIGKILL must come after the daemon's own
// bounded drain, or a committed batch's bookkeeping is cut off.
func checkGracePeriod(t *testing.T, o object, grace *int64, env map[string]string) {
	t.Helper()
	timeout := defaultShutdownTimeout
	if v, ok := env["IDEMD_SHUTDOWN_TIMEOUT"]; ok {
		d, err := time.ParseDuration(v)
		if err != nil {
			t.Errorf("%s: IDEMD_SHUTDOWN_TIMEOUT %q: %v", o, v, err)
			return
		}
		timeout = d
	}
	if grace == nil {
		t.Errorf("%s: terminationGracePeriodSeconds is not set", o)
		return
	}
	if g := time.Duration(*grace) * time.Second; g <= timeout+opsServerStopTimeout {
		t.Errorf("%s: terminationGracePeriodSeconds %s must exceed --shutdown-timeout %s + %s", o, g, timeout, opsServerStopTimeout)
	}
}

func checkPDB(t *testing.T, r *rendered, o object, d *appsv1.Deployment) {
	t.Helper()
	for _, p := range r.byKind("PodDisruptionBudget") {
		pdb := p.Obj.(*policyv1.PodDisruptionBudget)
		sel := labels.SelectorFromSet(pdb.Spec.Selector.MatchLabels)
		if sel.Matches(labels.Set(d.Spec.Template.Labels)) {
			if pdb.Spec.MinAvailable != nil && pdb.Spec.MinAvailable.IntValue() >= int(ptrOr(d.Spec.Replicas, 1)) {
				t.Errorf("%s: minAvailable %s blocks every drain at %d replicas", p, pdb.Spec.MinAvailable, ptrOr(d.Spec.Replicas, 1))
			}
			return
		}
	}
	t.Errorf("%s: no PodDisruptionBudget selects its pods", o)
}

// checkNetworkPolicies: the pods are selected by a policy that restricts
// both directions, ingress only reaches the metrics port, and DNS is allowed
// out (or nothing resolves the database's name).
func checkNetworkPolicies(t *testing.T, r *rendered, o object, podLabels map[string]string) {
	t.Helper()
	var ingress, egress, dns bool
	for _, p := range r.byKind("NetworkPolicy") {
		np := p.Obj.(*networkingv1.NetworkPolicy)
		if !labels.SelectorFromSet(np.Spec.PodSelector.MatchLabels).Matches(labels.Set(podLabels)) {
			continue
		}
		for _, pt := range np.Spec.PolicyTypes {
			ingress = ingress || pt == networkingv1.PolicyTypeIngress
			egress = egress || pt == networkingv1.PolicyTypeEgress
		}
		for _, rule := range np.Spec.Ingress {
			if len(rule.From) == 0 {
				t.Errorf("%s: ingress rule open to every source", p)
			}
			for _, port := range rule.Ports {
				if port.Port == nil || port.Port.String() != "metrics" {
					t.Errorf("%s: ingress allowed to port %v, want only \"metrics\"", p, port.Port)
				}
			}
		}
		for _, rule := range np.Spec.Egress {
			for _, port := range rule.Ports {
				if port.Port != nil && port.Port.IntValue() == 53 {
					dns = true
				}
			}
		}
	}
	if !ingress || !egress {
		t.Errorf("%s: pods not covered by Ingress and Egress NetworkPolicies (ingress %v, egress %v)", o, ingress, egress)
	}
	if !dns {
		t.Errorf("%s: no NetworkPolicy allows DNS egress", o)
	}
}

func TestReaperCronJobs(t *testing.T) {
	for _, dir := range overlays {
		t.Run(dir, func(t *testing.T) {
			r := render(t, dir)
			o, ok := r.find("CronJob", "idemd-reaper")
			if !ok {
				t.Fatal("no CronJob idemd-reaper")
			}
			cj := o.Obj.(*batchv1.CronJob)
			if cj.Spec.ConcurrencyPolicy != batchv1.ForbidConcurrent {
				t.Errorf("%s: concurrencyPolicy %q, want Forbid", o, cj.Spec.ConcurrencyPolicy)
			}
			if cj.Spec.StartingDeadlineSeconds == nil {
				t.Errorf("%s: startingDeadlineSeconds is not set", o)
			}
			if isTrue(cj.Spec.Suspend) {
				t.Errorf("%s is suspended", o)
			}
			c := checkJobSpec(t, r, o, &cj.Spec.JobTemplate.Spec, "reaper", "/usr/local/bin/reaper")
			if c != nil {
				env := r.containerEnv(t, c)
				if v, ok := env["IDEMD_MAX_RUNTIME"]; ok {
					d, err := time.ParseDuration(v)
					if err != nil {
						t.Errorf("%s: IDEMD_MAX_RUNTIME %q: %v", o, v, err)
					} else if ads := cj.Spec.JobTemplate.Spec.ActiveDeadlineSeconds; ads != nil && time.Duration(*ads)*time.Second <= d {
						t.Errorf("%s: activeDeadlineSeconds %ds would kill a run before --max-runtime %s ends it cleanly", o, *ads, d)
					}
				}
				if slices.Contains(c.Args, "--dry-run") {
					t.Errorf("%s: the scheduled reaper must not be a dry run", o)
				}
			}

			o, ok = r.find("CronJob", "idemd-reaper-dry-run")
			if !ok {
				t.Fatal("no CronJob idemd-reaper-dry-run")
			}
			dry := o.Obj.(*batchv1.CronJob)
			if !isTrue(dry.Spec.Suspend) {
				t.Errorf("%s must be suspended: it is a template for kubectl create job --from", o)
			}
			if c := checkJobSpec(t, r, o, &dry.Spec.JobTemplate.Spec, "reaper", "/usr/local/bin/reaper"); c != nil && !slices.Contains(c.Args, "--dry-run") {
				t.Errorf("%s: args %v lack --dry-run", o, c.Args)
			}

			o, ok = r.find("Job", "idemd-migrate")
			if !ok {
				t.Fatal("no Job idemd-migrate")
			}
			migrate := o.Obj.(*batchv1.Job)
			if c := checkJobSpec(t, r, o, &migrate.Spec, "migrate", "/usr/local/bin/idemctl"); c != nil && (len(c.Args) == 0 || c.Args[0] != "migrate") {
				t.Errorf("%s: args %v, want idemctl migrate", o, c.Args)
			}
			checkGitOpsJob(t, o, migrate)
		})
	}
}

// checkJobSpec checks what every Job needs and returns its main container.
func checkJobSpec(t *testing.T, r *rendered, o object, js *batchv1.JobSpec, name, command string) *corev1.Container {
	t.Helper()
	if js.BackoffLimit == nil {
		t.Errorf("%s: backoffLimit is not set", o)
	}
	if js.ActiveDeadlineSeconds == nil {
		t.Errorf("%s: activeDeadlineSeconds is not set", o)
	}
	// The migration Job keeps no TTL (checkGitOpsJob); the reaper's Jobs,
	// which a CronJob creates, are removed by theirs.
	if js.TTLSecondsAfterFinished == nil && o.Kind == "CronJob" {
		t.Errorf("%s: ttlSecondsAfterFinished is not set", o)
	}
	// podFailurePolicy is only accepted with restartPolicy Never.
	if js.Template.Spec.RestartPolicy != corev1.RestartPolicyNever {
		t.Errorf("%s: restartPolicy %q, want Never", o, js.Template.Spec.RestartPolicy)
	}
	failsOn2 := false
	if js.PodFailurePolicy != nil {
		for _, rule := range js.PodFailurePolicy.Rules {
			ec := rule.OnExitCodes
			if rule.Action == batchv1.PodFailurePolicyActionFailJob && ec != nil &&
				ec.Operator == batchv1.PodFailurePolicyOnExitCodesOpIn && slices.Contains(ec.Values, 2) &&
				(ec.ContainerName == nil || *ec.ContainerName == name) {
				failsOn2 = true
			}
		}
	}
	if !failsOn2 {
		t.Errorf("%s: podFailurePolicy must FailJob on exit code 2 (bad configuration is not retried)", o)
	}
	c := container(js.Template.Spec.Containers, name)
	if c == nil {
		t.Errorf("%s: no container %s", o, name)
		return nil
	}
	if len(c.Command) != 1 || c.Command[0] != command {
		t.Errorf("%s: command %v, want [%s]", o, c.Command, command)
	}
	if path.Base(c.Command[0]) != path.Base(command) {
		return nil
	}
	return c
}

// TestReferencesResolve: every ConfigMap a pod reads is rendered, every
// Secret is rendered or documented in base/secret.example.yaml with the key,
// and every file path a setting names is inside a mounted volume.
func TestReferencesResolve(t *testing.T) {
	for _, dir := range overlays {
		t.Run(dir, func(t *testing.T) {
			r := render(t, dir)
			for _, w := range r.pods() {
				for _, c := range w.Pod.Spec.Containers {
					env := r.containerEnv(t, &c)
					for _, e := range c.Env {
						if ref := e.ValueFrom; ref != nil && ref.SecretKeyRef != nil {
							checkSecretKey(t, r, w, ref.SecretKeyRef.Name, ref.SecretKeyRef.Key)
						}
					}
					volumes := map[string]corev1.Volume{}
					if ss, ok := w.Owner.Obj.(*appsv1.StatefulSet); ok {
						for _, pvc := range ss.Spec.VolumeClaimTemplates {
							volumes[pvc.Name] = corev1.Volume{Name: pvc.Name}
						}
					}
					for _, v := range w.Pod.Spec.Volumes {
						volumes[v.Name] = v
						if v.Secret != nil {
							checkSecretKey(t, r, w, v.Secret.SecretName, "")
						}
					}
					for _, m := range c.VolumeMounts {
						if _, ok := volumes[m.Name]; !ok {
							t.Errorf("%s: container %s mounts undefined volume %s", w, c.Name, m.Name)
						}
					}
					values := slices.Clone(c.Args)
					for _, k := range sortedKeys(env) {
						values = append(values, env[k])
					}
					for _, v := range values {
						if i := strings.Index(v, "="); strings.HasPrefix(v, "--") && i > 0 {
							v = v[i+1:]
						}
						if !strings.HasPrefix(v, "/etc/") {
							continue
						}
						if !underMount(v, c.VolumeMounts) {
							t.Errorf("%s: container %s refers to %s, which no volume provides", w, c.Name, v)
						}
					}
				}
			}
		})
	}
}

func checkSecretKey(t *testing.T, r *rendered, w workload, name, key string) {
	t.Helper()
	data, ok := r.configData("Secret", name)
	if !ok {
		data = exampleSecretKeys(t, name)
	}
	if data == nil {
		t.Errorf("%s: Secret %s is neither rendered nor documented in base/secret.example.yaml", w, name)
		return
	}
	if _, ok := data[key]; key != "" && !ok {
		t.Errorf("%s: Secret %s has no key %s", w, name, key)
	}
}

func underMount(p string, mounts []corev1.VolumeMount) bool {
	for _, m := range mounts {
		if p == m.MountPath || strings.HasPrefix(p, strings.TrimSuffix(m.MountPath, "/")+"/") {
			return true
		}
	}
	return false
}

func isTrue(b *bool) bool { return b != nil && *b }

func ptrOr[T any](p *T, def T) T {
	if p == nil {
		return def
	}
	return *p
}

// gitOpsAnnotations make the migration Job safe to re-apply under Argo CD
// (a wave of its own before the daemons', deleted and recreated at each
// sync; TestArgoCDOrder checks what it reads comes first) and under Flux
// (recreated when its immutable template changes).
var gitOpsAnnotations = map[string]string{
	"argocd.argoproj.io/sync-wave":      "-1",
	"argocd.argoproj.io/sync-options":   "Force=true,Replace=true",
	"kustomize.toolkit.fluxcd.io/force": "enabled",
}

// checkGitOpsJob: the migration Job carries the GitOps annotations and no
// TTL: a TTL deletes the finished Job, which a GitOps tool then sees
// missing and creates again, migrating at every sync.
func checkGitOpsJob(t *testing.T, o object, j *batchv1.Job) {
	t.Helper()
	for k, v := range gitOpsAnnotations {
		if j.Annotations[k] != v {
			t.Errorf("%s: annotation %s = %q, want %q", o, k, j.Annotations[k], v)
		}
	}
	if j.Spec.TTLSecondsAfterFinished != nil {
		t.Errorf("%s: ttlSecondsAfterFinished %d: a GitOps tool recreates the Job the TTL deletes", o, *j.Spec.TTLSecondsAfterFinished)
	}
	if j.GenerateName != "" {
		t.Errorf("%s: generateName %q: kubectl apply and kustomize need a name", o, j.GenerateName)
	}
}
