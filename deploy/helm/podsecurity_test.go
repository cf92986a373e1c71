package helm

import (
	"testing"

	psaapi "k8s.io/pod-security-admission/api"
	psapolicy "k8s.io/pod-security-admission/policy"
)

// TestPodSecurity: every pod the chart renders, with its defaults and with
// the options that add to pods (pull secrets, extra volumes, annotations),
// is admitted by the kube-apiserver's Pod Security evaluator at
// restricted, the level the namespace must enforce; and the evaluator
// refuses a pod that breaks it, so the check has teeth.
func TestPodSecurity(t *testing.T) {
	ev, err := psapolicy.NewEvaluator(psapolicy.DefaultChecks(), nil)
	if err != nil {
		t.Fatal(err)
	}
	lv := psaapi.LevelVersion{Level: psaapi.LevelRestricted, Version: psaapi.LatestVersion()}
	for what, values := range map[string]map[string]any{
		"defaults": nil,
		"options": {
			"imagePullSecrets":  []any{map[string]any{"name": "registry"}},
			"podAnnotations":    map[string]any{"vault.hashicorp.com/agent-inject": "true"},
			"database":          map[string]any{"passwordFile": "/var/run/secrets/db/password"},
			"extraVolumes":      []any{map[string]any{"name": "db", "secret": map[string]any{"secretName": "db-password"}}},
			"extraVolumeMounts": []any{map[string]any{"name": "db", "mountPath": "/var/run/secrets/db", "readOnly": true}},
		},
	} {
		n := 0
		for _, o := range renderChart(t, values) {
			p := pod(o)
			if p == nil {
				continue
			}
			n++
			res := psapolicy.AggregateCheckResults(ev.EvaluatePod(lv, &p.ObjectMeta, &p.Spec))
			if !res.Allowed {
				t.Errorf("%s: %s %s refused by Pod Security restricted: %s", what, o.Kind, o.Name, res.ForbiddenDetail())
			}
			for _, c := range p.Spec.Containers {
				if sc := c.SecurityContext; sc == nil || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
					t.Errorf("%s: %s %s: container %s: readOnlyRootFilesystem must be true", what, o.Kind, o.Name, c.Name)
				}
				if _, ok := c.Resources.Limits["memory"]; !ok {
					t.Errorf("%s: %s %s: container %s has no memory limit", what, o.Kind, o.Name, c.Name)
				}
			}
			if p.Spec.AutomountServiceAccountToken == nil || *p.Spec.AutomountServiceAccountToken {
				t.Errorf("%s: %s %s mounts a service account token", what, o.Kind, o.Name)
			}
		}
		if n < 6 {
			t.Errorf("%s: %d pod templates rendered, want at least 6", what, n)
		}
	}

	// Teeth: the first Deployment's pod, made privileged, is refused.
	for _, o := range renderChart(t, nil) {
		if o.Kind != "Deployment" {
			continue
		}
		bad := pod(o).DeepCopy()
		yes := true
		bad.Spec.Containers[0].SecurityContext.Privileged = &yes
		if res := psapolicy.AggregateCheckResults(ev.EvaluatePod(lv, &bad.ObjectMeta, &bad.Spec)); res.Allowed {
			t.Errorf("the evaluator admits a privileged copy of %s", o.Name)
		}
		break
	}
}
