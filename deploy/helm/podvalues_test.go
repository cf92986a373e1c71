package helm

import (
	"encoding/json"
	"fmt"
	"os"
	"reflect"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
)

// components are the chart's workloads by the values key that configures
// them, with the objects each renders.
var components = map[string][][2]string{
	"enqueuer":  {{"Deployment", "idemd-enqueuer"}},
	"completer": {{"Deployment", "idemd-completer"}},
	"console":   {{"Deployment", "idemd-console"}},
	"reaper":    {{"CronJob", "idemd-reaper"}, {"CronJob", "idemd-reaper-dry-run"}},
	"migrate":   {{"Job", "idemd-migrate"}},
}

// podValue is one of the standard values every workload takes: where it
// lands in a rendered pod template, and two samples, for every workload
// and for one component.
type podValue struct {
	key              string
	global, override any
	// merged: a component's map merges over the global one key by key;
	// else the component's replaces the global one.
	merged bool
	// at reads the field from the pod template (JSON-shaped).
	at func(p *corev1.PodTemplateSpec) any
	// tail: the chart puts its own entries first; the value is the end of
	// the list.
	tail bool
}

func container(p *corev1.PodTemplateSpec) *corev1.Container { return &p.Spec.Containers[0] }

var podValues = []podValue{
	{key: "podAnnotations", merged: true,
		global:   map[string]any{"vault.hashicorp.com/agent-inject": "true", "vault.hashicorp.com/role": "idemd-runtime"},
		override: map[string]any{"vault.hashicorp.com/role": "idemd-migrator", "example.com/own": "yes"},
		at:       func(p *corev1.PodTemplateSpec) any { return p.Annotations }},
	{key: "podLabels", merged: true,
		global:   map[string]any{"team": "payments", "tier": "backend"},
		override: map[string]any{"tier": "batch", "example.com/own": "yes"},
		at:       func(p *corev1.PodTemplateSpec) any { return p.Labels }},
	{key: "nodeSelector", merged: true,
		global:   map[string]any{"kubernetes.io/os": "linux", "pool": "general"},
		override: map[string]any{"pool": "batch"},
		at:       func(p *corev1.PodTemplateSpec) any { return p.Spec.NodeSelector }},
	{key: "tolerations",
		global:   []any{map[string]any{"key": "dedicated", "operator": "Equal", "value": "idemd", "effect": "NoSchedule"}},
		override: []any{map[string]any{"key": "batch", "operator": "Exists", "effect": "NoExecute"}},
		at:       func(p *corev1.PodTemplateSpec) any { return p.Spec.Tolerations }},
	{key: "affinity",
		global:   nodeAffinity("general"),
		override: nodeAffinity("batch"),
		at:       func(p *corev1.PodTemplateSpec) any { return p.Spec.Affinity }},
	{key: "topologySpreadConstraints",
		global:   []any{spread("topology.kubernetes.io/zone")},
		override: []any{spread("kubernetes.io/hostname"), spread("topology.kubernetes.io/region")},
		at:       func(p *corev1.PodTemplateSpec) any { return p.Spec.TopologySpreadConstraints }},
	{key: "priorityClassName",
		global:   "idemd-high",
		override: "batch-low",
		at:       func(p *corev1.PodTemplateSpec) any { return p.Spec.PriorityClassName }},
	{key: "extraEnv", tail: true,
		global:   []any{map[string]any{"name": "HTTPS_PROXY", "value": "http://proxy:3128"}},
		override: []any{map[string]any{"name": "GODEBUG", "value": "x509negativeserial=1"}, map[string]any{"name": "POD_NAME", "valueFrom": map[string]any{"fieldRef": map[string]any{"fieldPath": "metadata.name"}}}},
		at:       func(p *corev1.PodTemplateSpec) any { return container(p).Env }},
	{key: "extraEnvFrom", tail: true,
		global:   []any{map[string]any{"secretRef": map[string]any{"name": "proxy"}}},
		override: []any{map[string]any{"configMapRef": map[string]any{"name": "own"}}},
		at:       func(p *corev1.PodTemplateSpec) any { return container(p).EnvFrom }},
	{key: "extraVolumes", tail: true,
		global:   []any{map[string]any{"name": "token", "emptyDir": map[string]any{"medium": "Memory"}}},
		override: []any{map[string]any{"name": "ca", "configMap": map[string]any{"name": "ca-bundle"}}},
		at:       func(p *corev1.PodTemplateSpec) any { return p.Spec.Volumes }},
	{key: "extraVolumeMounts", tail: true,
		global:   []any{map[string]any{"name": "token", "mountPath": "/var/run/idemd", "readOnly": true}},
		override: []any{map[string]any{"name": "ca", "mountPath": "/etc/ssl/idemd"}},
		at:       func(p *corev1.PodTemplateSpec) any { return container(p).VolumeMounts }},
}

func nodeAffinity(pool string) map[string]any {
	return map[string]any{"nodeAffinity": map[string]any{"requiredDuringSchedulingIgnoredDuringExecution": map[string]any{
		"nodeSelectorTerms": []any{map[string]any{"matchExpressions": []any{map[string]any{"key": "pool", "operator": "In", "values": []any{pool}}}}}}}}
}

func spread(key string) map[string]any {
	return map[string]any{"maxSkew": 1, "topologyKey": key, "whenUnsatisfiable": "DoNotSchedule",
		"labelSelector": map[string]any{"matchLabels": map[string]any{"app.kubernetes.io/part-of": "idemd"}}}
}

// jsonShape turns a value into what encoding/json makes of it, so a
// typed field and a values sample compare.
func jsonShape(t *testing.T, v any) any {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	var out any
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatal(err)
	}
	return out
}

// holds reports whether got carries want: every key of a map, the end of
// a list (tail) or the same value.
func (pv podValue) holds(t *testing.T, got, want any) bool {
	t.Helper()
	g, w := jsonShape(t, got), jsonShape(t, want)
	switch {
	case pv.merged:
		gm, _ := g.(map[string]any)
		for k, v := range w.(map[string]any) {
			if gm[k] != v {
				return false
			}
		}
		return true
	case pv.tail:
		gl, _ := g.([]any)
		wl := w.([]any)
		return len(gl) >= len(wl) && reflect.DeepEqual(gl[len(gl)-len(wl):], wl)
	}
	return reflect.DeepEqual(g, w)
}

// mergedOver is a component's map over the global one.
func mergedOver(global, override any) any {
	out := map[string]any{}
	for k, v := range global.(map[string]any) {
		out[k] = v
	}
	for k, v := range override.(map[string]any) {
		out[k] = v
	}
	return out
}

// TestPodValues: each standard value, set once for every workload, lands
// where Kubernetes reads it in every Deployment, CronJob and the migration
// Job; set on one component too, that component's wins (a map's keys over
// the global ones) and the others keep the global value.
func TestPodValues(t *testing.T) {
	names := make([]string, 0, len(components))
	for c := range components {
		names = append(names, c)
	}
	slices.Sort(names)
	for _, pv := range podValues {
		t.Run(pv.key, func(t *testing.T) {
			// Nothing set: the value is absent (or only the chart's own).
			os := renderChart(t, nil)
			for _, c := range names {
				for _, ref := range components[c] {
					if p := podOf(t, os, ref); pv.holds(t, pv.at(p), pv.global) {
						t.Errorf("%s %s carries the sample %s without it being set", ref[0], ref[1], pv.key)
					}
				}
			}
			// Set for every workload.
			os = renderChart(t, map[string]any{pv.key: pv.global})
			for _, c := range names {
				for _, ref := range components[c] {
					if got := pv.at(podOf(t, os, ref)); !pv.holds(t, got, pv.global) {
						t.Errorf("%s: %s %s has %s, want %s", pv.key, ref[0], ref[1], show(got), show(pv.global))
					}
				}
			}
			// Overridden for one component at a time.
			for _, c := range names {
				os := renderChart(t, map[string]any{pv.key: pv.global, c: map[string]any{pv.key: pv.override}})
				want := pv.override
				if pv.merged {
					want = mergedOver(pv.global, pv.override)
				}
				for _, other := range names {
					for _, ref := range components[other] {
						got := pv.at(podOf(t, os, ref))
						switch {
						case other == c && !pv.holds(t, got, want):
							t.Errorf("%s.%s set: %s %s has %s, want %s", c, pv.key, ref[0], ref[1], show(got), show(want))
						case other == c && !pv.merged && pv.tail && pv.holds(t, got, append(slices.Clone(pv.global.([]any)), pv.override.([]any)...)):
							t.Errorf("%s.%s set: %s %s has the global entries too: %s", c, pv.key, ref[0], ref[1], show(got))
						case other != c && !pv.holds(t, got, pv.global):
							t.Errorf("%s.%s set: %s %s has %s, want the global %s", c, pv.key, ref[0], ref[1], show(got), show(pv.global))
						}
					}
				}
			}
		})
	}
}

// allPodValues sets every standard value globally and, differently, on
// every component, with a token and a ServiceAccount of the migration's
// own and each component's egress: the rendering the Kubernetes schema
// check validates (schema_test.go).
func allPodValues() map[string]any {
	values := map[string]any{
		"serviceAccount": map[string]any{"automountServiceAccountToken": true, "annotations": map[string]any{"example.com/role": "idemd"}},
		"networkPolicy":  map[string]any{"extraEgress": []any{map[string]any{"ports": []any{map[string]any{"port": 8200, "protocol": "TCP"}}}}},
	}
	for _, pv := range podValues {
		values[pv.key] = pv.global
	}
	for c := range components {
		cv := map[string]any{
			"serviceAccount": map[string]any{"automountServiceAccountToken": false},
			"networkPolicy":  map[string]any{"extraEgress": []any{map[string]any{"ports": []any{map[string]any{"port": 587, "protocol": "TCP"}}}}},
		}
		if c == "migrate" {
			cv["serviceAccount"] = map[string]any{"name": "idemd-migrator", "automountServiceAccountToken": true}
		}
		for _, pv := range podValues {
			cv[pv.key] = pv.override
		}
		values[c] = cv
	}
	return values
}

func show(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

func podOf(t *testing.T, os objects, ref [2]string) *corev1.PodTemplateSpec {
	t.Helper()
	o, ok := os.find(ref[0], ref[1])
	if !ok {
		t.Fatalf("no %s %s rendered", ref[0], ref[1])
	}
	return pod(o)
}

// TestPodValuesKeepTheChartsOwn: the standard values add to what the chart
// needs, never replace it: the selector labels, the config checksum, the
// completer's auth secret volume, DATABASE_URL and the ConfigMaps.
func TestPodValuesKeepTheChartsOwn(t *testing.T) {
	os := renderChart(t, map[string]any{
		"podLabels":         map[string]any{"app.kubernetes.io/name": "mine", "app.kubernetes.io/part-of": "mine"},
		"podAnnotations":    map[string]any{"a": "b"},
		"extraEnv":          []any{map[string]any{"name": "X", "value": "y"}},
		"extraEnvFrom":      []any{map[string]any{"secretRef": map[string]any{"name": "s"}}},
		"extraVolumes":      []any{map[string]any{"name": "v", "emptyDir": map[string]any{}}},
		"extraVolumeMounts": []any{map[string]any{"name": "v", "mountPath": "/v"}},
	})
	for c, refs := range components {
		for _, ref := range refs {
			p := podOf(t, os, ref)
			if p.Labels["app.kubernetes.io/name"] != c || p.Labels["app.kubernetes.io/part-of"] != "idemd" {
				t.Errorf("%s %s: podLabels replaced the selector labels: %v", ref[0], ref[1], p.Labels)
			}
			if _, ok := p.Annotations["checksum/config"]; !ok && c != "migrate" {
				t.Errorf("%s %s: podAnnotations dropped checksum/config: %v", ref[0], ref[1], p.Annotations)
			}
			ct := container(p)
			if _, ok := envValue(*ct, "DATABASE_URL"); !ok && ct.Env[0].Name != "DATABASE_URL" {
				t.Errorf("%s %s: no DATABASE_URL beside extraEnv: %v", ref[0], ref[1], ct.Env)
			}
			if c != "migrate" && (len(ct.EnvFrom) != 3 || ct.EnvFrom[0].ConfigMapRef == nil || ct.EnvFrom[0].ConfigMapRef.Name != "idemd-common") {
				t.Errorf("%s %s: envFrom %v, want idemd-common, idemd-%s and the extra Secret", ref[0], ref[1], ct.EnvFrom, c)
			}
		}
	}
	p := podOf(t, os, [2]string{"Deployment", "idemd-completer"})
	if len(p.Spec.Volumes) != 2 || p.Spec.Volumes[0].Name != "internal-auth" || len(container(p).VolumeMounts) != 2 {
		t.Errorf("completer: volumes %v, mounts %v: want internal-auth and the extra one", p.Spec.Volumes, container(p).VolumeMounts)
	}
}

// TestTopologySpreadDefaults: without a value the enqueuer's and the
// completer's replicas spread over nodes as before, the others not at all; a constraint given without a
// labelSelector counts the pods of its own component.
func TestTopologySpreadDefaults(t *testing.T) {
	os := renderChart(t, nil)
	for c, refs := range components {
		for _, ref := range refs {
			tsc := podOf(t, os, ref).Spec.TopologySpreadConstraints
			if c != "enqueuer" && c != "completer" {
				if len(tsc) != 0 {
					t.Errorf("%s %s: default topologySpreadConstraints %v, want none", ref[0], ref[1], tsc)
				}
				continue
			}
			if len(tsc) != 1 || tsc[0].TopologyKey != "kubernetes.io/hostname" || tsc[0].WhenUnsatisfiable != corev1.ScheduleAnyway ||
				tsc[0].LabelSelector == nil || tsc[0].LabelSelector.MatchLabels["app.kubernetes.io/name"] != c {
				t.Errorf("%s %s: default topologySpreadConstraints %s, want one over kubernetes.io/hostname counting its own pods", ref[0], ref[1], show(tsc))
			}
		}
	}
	os = renderChart(t, map[string]any{"topologySpreadConstraints": []any{map[string]any{"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone", "whenUnsatisfiable": "DoNotSchedule"}}})
	for c, refs := range components {
		for _, ref := range refs {
			tsc := podOf(t, os, ref).Spec.TopologySpreadConstraints
			if len(tsc) != 1 || tsc[0].TopologyKey != "topology.kubernetes.io/zone" || tsc[0].LabelSelector == nil ||
				tsc[0].LabelSelector.MatchLabels["app.kubernetes.io/name"] != c || tsc[0].LabelSelector.MatchLabels["app.kubernetes.io/part-of"] != "idemd" {
				t.Errorf("%s %s: %s, want the zone constraint counting the %s pods", ref[0], ref[1], show(tsc), c)
			}
		}
	}
}

// TestServiceAccount: the chart's ServiceAccount by default, with no token
// mounted anywhere; a token for every workload or for one; an existing
// ServiceAccount instead of the chart's; the migration Job on the
// namespace's default unless it names its own.
func TestServiceAccount(t *testing.T) {
	type want struct {
		name      string
		automount bool
	}
	check := func(t *testing.T, values map[string]any, sa *want, pods map[string]want) {
		t.Helper()
		os := renderChart(t, values)
		o, ok := os.find("ServiceAccount", sa.name)
		switch {
		case sa.name == "" && len(os.names("ServiceAccount")) > 0:
			t.Errorf("ServiceAccounts %v rendered, want none", os.names("ServiceAccount"))
		case sa.name != "" && !ok:
			t.Errorf("no ServiceAccount %s (rendered: %v)", sa.name, os.names("ServiceAccount"))
		case ok:
			if got := o.Obj.(*corev1.ServiceAccount).AutomountServiceAccountToken; got == nil || *got != sa.automount {
				t.Errorf("ServiceAccount %s: automountServiceAccountToken %v, want %v", sa.name, got, sa.automount)
			}
		}
		for c, refs := range components {
			for _, ref := range refs {
				p := podOf(t, os, ref)
				w := pods[c]
				if p.Spec.ServiceAccountName != w.name {
					t.Errorf("%s %s: serviceAccountName %q, want %q", ref[0], ref[1], p.Spec.ServiceAccountName, w.name)
				}
				if got := p.Spec.AutomountServiceAccountToken; got == nil || *got != w.automount {
					t.Errorf("%s %s: automountServiceAccountToken %v, want %v", ref[0], ref[1], got, w.automount)
				}
			}
		}
	}
	all := func(name string, automount bool, migrate want) map[string]want {
		out := map[string]want{"migrate": migrate}
		for _, c := range []string{"enqueuer", "completer", "console", "reaper"} {
			out[c] = want{name, automount}
		}
		return out
	}
	t.Run("defaults", func(t *testing.T) {
		check(t, nil, &want{"idemd", false}, all("idemd", false, want{"", false}))
	})
	t.Run("token for every workload", func(t *testing.T) {
		check(t, map[string]any{"serviceAccount": map[string]any{"automountServiceAccountToken": true}},
			&want{"idemd", true}, all("idemd", true, want{"", true}))
	})
	t.Run("token and account for the migration only", func(t *testing.T) {
		check(t, map[string]any{"migrate": map[string]any{"serviceAccount": map[string]any{"name": "idemd-migrator", "automountServiceAccountToken": true}}},
			&want{"idemd", false}, all("idemd", false, want{"idemd-migrator", true}))
	})
	t.Run("component turns the token off", func(t *testing.T) {
		pods := all("idemd", true, want{"", true})
		pods["console"] = want{"idemd", false}
		check(t, map[string]any{"serviceAccount": map[string]any{"automountServiceAccountToken": true}, "console": map[string]any{"serviceAccount": map[string]any{"automountServiceAccountToken": false}}},
			&want{"idemd", true}, pods)
	})
	t.Run("existing account", func(t *testing.T) {
		check(t, map[string]any{"serviceAccount": map[string]any{"create": false, "name": "platform-idemd"}},
			&want{"", false}, all("platform-idemd", false, want{"", false}))
	})
	t.Run("renamed and annotated", func(t *testing.T) {
		values := map[string]any{"serviceAccount": map[string]any{"name": "payments-idemd", "annotations": map[string]any{"eks.amazonaws.com/role-arn": "arn:aws:iam::1:role/idemd"}}}
		check(t, values, &want{"payments-idemd", false}, all("payments-idemd", false, want{"", false}))
		if o, _ := renderChart(t, values).find("ServiceAccount", "payments-idemd"); o.Annots["eks.amazonaws.com/role-arn"] != "arn:aws:iam::1:role/idemd" {
			t.Errorf("ServiceAccount annotations %v", o.Annots)
		}
	})
	if _, err := tryRenderChart(map[string]any{"serviceAccount": map[string]any{"create": false, "name": ""}}); err == nil {
		t.Error("serviceAccount.create false without a name rendered")
	}
}

// TestNetworkPolicyExtraEgress: networkPolicy.extraEgress is allowed to
// every idemd pod after DNS and the database; a component's extraEgress
// gets a NetworkPolicy of its own selecting that component's pods only.
func TestNetworkPolicyExtraEgress(t *testing.T) {
	vault := map[string]any{
		"to":    []any{map[string]any{"namespaceSelector": map[string]any{"matchLabels": map[string]any{"kubernetes.io/metadata.name": "vault"}}}},
		"ports": []any{map[string]any{"port": 8200, "protocol": "TCP"}},
	}
	smtp := map[string]any{"ports": []any{map[string]any{"port": 587, "protocol": "TCP"}}}
	os := renderChart(t, nil)
	def, _ := os.find("NetworkPolicy", "idemd-default")
	if n := len(def.Obj.(*networkingv1.NetworkPolicy).Spec.Egress); n != 2 {
		t.Fatalf("idemd-default has %d egress rules by default, want 2 (DNS, database)", n)
	}
	os = renderChart(t, map[string]any{"networkPolicy": map[string]any{"extraEgress": []any{vault}}, "migrate": map[string]any{"networkPolicy": map[string]any{"extraEgress": []any{smtp}}}})
	def, _ = os.find("NetworkPolicy", "idemd-default")
	egress := def.Obj.(*networkingv1.NetworkPolicy).Spec.Egress
	if len(egress) != 3 || !reflect.DeepEqual(jsonShape(t, egress[2]), jsonShape(t, vault)) {
		t.Errorf("idemd-default egress %s, want DNS, the database and %s", show(egress), show(vault))
	}
	own, ok := os.find("NetworkPolicy", "idemd-migrate-egress")
	if !ok {
		t.Fatalf("migrate.networkPolicy.extraEgress: no NetworkPolicy idemd-migrate-egress (rendered: %v)", os.names("NetworkPolicy"))
	}
	np := own.Obj.(*networkingv1.NetworkPolicy)
	if np.Spec.PodSelector.MatchLabels["app.kubernetes.io/name"] != "migrate" || len(np.Spec.Egress) != 1 ||
		!reflect.DeepEqual(jsonShape(t, np.Spec.Egress[0]), jsonShape(t, smtp)) || !slices.Equal(np.Spec.PolicyTypes, []networkingv1.PolicyType{networkingv1.PolicyTypeEgress}) {
		t.Errorf("idemd-migrate-egress: %s", show(np.Spec))
	}
	for _, name := range os.names("NetworkPolicy") {
		if strings.HasSuffix(name, "-egress") && name != "idemd-migrate-egress" {
			t.Errorf("NetworkPolicy %s rendered for a component that set no extraEgress", name)
		}
	}
}

// TestStandardValuesInSchema: every standard value is in values.schema.json
// at the top and in each component, described, so an editor and `helm
// install` both know it; and values.yaml sets each (its comments are the
// chart's reference).
func TestStandardValuesInSchema(t *testing.T) {
	raw, err := os.ReadFile(chartDir + "/values.schema.json")
	if err != nil {
		t.Fatal(err)
	}
	var schema struct {
		Definitions map[string]map[string]any
		Properties  map[string]map[string]any
	}
	if err := json.Unmarshal(raw, &schema); err != nil {
		t.Fatal(err)
	}
	resolve := func(node map[string]any) map[string]any {
		if ref, ok := node["$ref"].(string); ok {
			return schema.Definitions[strings.TrimPrefix(ref, "#/definitions/")]
		}
		return node
	}
	described := func(where string, node map[string]any) {
		if node == nil {
			t.Errorf("%s: not in the schema", where)
			return
		}
		if d, _ := resolve(node)["description"].(string); d == "" {
			t.Errorf("%s: no description in the schema", where)
		}
	}
	for _, pv := range podValues {
		described(pv.key, schema.Properties[pv.key])
		for c := range components {
			props, _ := schema.Properties[c]["properties"].(map[string]any)
			node, _ := props[pv.key].(map[string]any)
			described(c+"."+pv.key, node)
		}
	}
	for c := range components {
		props, _ := schema.Properties[c]["properties"].(map[string]any)
		for _, k := range []string{"serviceAccount", "networkPolicy"} {
			node, _ := props[k].(map[string]any)
			described(c+"."+k, node)
			sub, _ := resolve(node)["properties"].(map[string]any)
			for name, n := range sub {
				described(fmt.Sprintf("%s.%s.%s", c, k, name), n.(map[string]any))
			}
		}
	}
	sa, _ := schema.Properties["serviceAccount"]["properties"].(map[string]any)
	for _, k := range []string{"create", "name", "annotations", "automountServiceAccountToken"} {
		node, _ := sa[k].(map[string]any)
		described("serviceAccount."+k, node)
	}
	np, _ := schema.Properties["networkPolicy"]["properties"].(map[string]any)
	node, _ := np["extraEgress"].(map[string]any)
	described("networkPolicy.extraEgress", node)
}
