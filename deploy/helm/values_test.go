package helm

import (
	"strings"
	"testing"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
)

// containers lists every container of the rendered workloads.
func containers(os objects) map[string]corev1.Container {
	out := map[string]corev1.Container{}
	for _, o := range os {
		if p := pod(o); p != nil {
			for _, c := range p.Spec.Containers {
				out[o.Kind+"/"+o.Name+"/"+c.Name] = c
			}
		}
	}
	return out
}

func envValue(c corev1.Container, name string) (string, bool) {
	for _, e := range c.Env {
		if e.Name == name {
			return e.Value, true
		}
	}
	return "", false
}

// TestMigrateHook: the migration is a pre-install,pre-upgrade hook that
// replaces the previous run's Job and removes a successful one, so neither
// Helm nor Argo CD (which maps the hook to PreSync) needs a manual
// `kubectl delete job`, and nothing depends on a TTL.
func TestMigrateHook(t *testing.T) {
	os := renderChart(t, nil)
	o, ok := os.find("Job", "idemd-migrate")
	if !ok {
		t.Fatal("no Job idemd-migrate")
	}
	if !o.Hook {
		t.Error("idemd-migrate is part of the release's manifest, not a hook")
	}
	for k, v := range map[string]string{
		"helm.sh/hook":               "pre-install,pre-upgrade",
		"helm.sh/hook-delete-policy": "before-hook-creation,hook-succeeded",
	} {
		if o.Annots[k] != v {
			t.Errorf("idemd-migrate: annotation %s = %q, want %q", k, o.Annots[k], v)
		}
	}
	if j := o.Obj.(*batchv1.Job); j.Spec.TTLSecondsAfterFinished != nil {
		t.Errorf("idemd-migrate has ttlSecondsAfterFinished %d: a GitOps tool would recreate the deleted Job", *j.Spec.TTLSecondsAfterFinished)
	}
	// A pre-install hook runs before the release's ConfigMaps exist.
	if p := pod(o); len(p.Spec.Containers[0].EnvFrom) > 0 {
		t.Errorf("idemd-migrate reads %v, which a pre-install hook runs before", p.Spec.Containers[0].EnvFrom)
	}
	for _, other := range os {
		if other.Hook && other.Name != "idemd-migrate" {
			t.Errorf("%s %s is a hook; only the migration should be", other.Kind, other.Name)
		}
	}
}

// TestImage: the tag defaults to the chart's appVersion; tag and digest
// override it; every container runs the same image.
func TestImage(t *testing.T) {
	digest := "sha256:" + strings.Repeat("ab", 32)
	for _, c := range []struct {
		values map[string]any
		want   string
	}{
		{nil, "ghcr.io/idemd/idemd:" + appVersion(t)},
		{map[string]any{"image": map[string]any{"repository": "registry.example.com/idemd", "tag": "v9.9.9", "digest": digest}}, "registry.example.com/idemd:v9.9.9@" + digest},
	} {
		cs := containers(renderChart(t, c.values))
		if len(cs) < 6 {
			t.Fatalf("%d containers rendered, want at least 6", len(cs))
		}
		for where, ct := range cs {
			if ct.Image != c.want {
				t.Errorf("%v: %s runs %q, want %q", c.values, where, ct.Image, c.want)
			}
		}
	}
}

// TestSwitches: each daemon and each monitoring object can be left out,
// and the monitoring objects carry the labels the values give them.
func TestSwitches(t *testing.T) {
	off := map[string]any{"enabled": false}
	os := renderChart(t, map[string]any{"enqueuer": off, "console": off})
	for _, gone := range [][2]string{{"Deployment", "idemd-enqueuer"}, {"PodDisruptionBudget", "idemd-enqueuer"}, {"ConfigMap", "idemd-enqueuer"}, {"Deployment", "idemd-console"}} {
		if _, ok := os.find(gone[0], gone[1]); ok {
			t.Errorf("enqueuer and console disabled: %s %s still rendered", gone[0], gone[1])
		}
	}
	if _, ok := os.find("Deployment", "idemd-completer"); !ok {
		t.Error("enqueuer disabled: the completer is gone too")
	}

	os = renderChart(t, map[string]any{"reaper": off, "completer": off, "migrate": off})
	for _, gone := range [][2]string{{"CronJob", "idemd-reaper"}, {"CronJob", "idemd-reaper-dry-run"}, {"Deployment", "idemd-completer"}, {"NetworkPolicy", "idemd-completer-api"}, {"Job", "idemd-migrate"}} {
		if _, ok := os.find(gone[0], gone[1]); ok {
			t.Errorf("reaper, completer and migrate disabled: %s %s still rendered", gone[0], gone[1])
		}
	}

	os = renderChart(t, map[string]any{"monitoring": map[string]any{"podMonitor": off, "prometheusRule": off, "dashboard": off}})
	for _, kind := range []string{"PodMonitor", "PrometheusRule"} {
		if n := os.names(kind); len(n) > 0 {
			t.Errorf("monitoring disabled: %s %v rendered", kind, n)
		}
	}
	if configMap(os, "idemd-grafana-dashboard") != nil {
		t.Error("dashboard disabled: its ConfigMap is rendered")
	}

	labels := map[string]any{"labels": map[string]any{"release": "prom"}}
	os = renderChart(t, map[string]any{"monitoring": map[string]any{"podMonitor": labels, "prometheusRule": labels}})
	for _, kind := range []string{"PodMonitor", "PrometheusRule"} {
		o, ok := os.find(kind, "idemd")
		if !ok || o.Labels["release"] != "prom" {
			t.Errorf("%s: labels %v, want release=prom", kind, o.Labels)
		}
	}
	// By default, kube-prometheus-stack's selectors find them.
	os = renderChart(t, nil)
	for _, kind := range []string{"PodMonitor", "PrometheusRule"} {
		if o, _ := os.find(kind, "idemd"); o.Labels["release"] != "kube-prometheus-stack" {
			t.Errorf("%s: labels %v by default, want release=kube-prometheus-stack", kind, o.Labels)
		}
	}
}

// TestPasswordFile: database.passwordFile and userFile reach every command
// that uses the runtime role, migratePasswordFile and migrateUserFile the
// migration, with the volumes; a user file without a password file is
// refused.
func TestPasswordFile(t *testing.T) {
	os := renderChart(t, map[string]any{
		"database": map[string]any{"passwordFile": "/var/run/secrets/db/password", "migratePasswordFile": "/var/run/secrets/db/migrate",
			"userFile": "/var/run/secrets/db/username", "migrateUserFile": "/var/run/secrets/db/migrate-username"},
		"extraVolumes":      []any{map[string]any{"name": "db", "secret": map[string]any{"secretName": "db-password"}}},
		"extraVolumeMounts": []any{map[string]any{"name": "db", "mountPath": "/var/run/secrets/db", "readOnly": true}},
	})
	for where, c := range containers(os) {
		want := "/var/run/secrets/db/password"
		if strings.HasPrefix(where, "Job/idemd-migrate/") {
			want = "/var/run/secrets/db/migrate"
		}
		if v, _ := envValue(c, "IDEMD_DATABASE_PASSWORD_FILE"); v != want {
			t.Errorf("%s: IDEMD_DATABASE_PASSWORD_FILE %q, want %q", where, v, want)
		}
		wantUser := "/var/run/secrets/db/username"
		if strings.HasPrefix(where, "Job/idemd-migrate/") {
			wantUser = "/var/run/secrets/db/migrate-username"
		}
		if v, _ := envValue(c, "IDEMD_DATABASE_USER_FILE"); v != wantUser {
			t.Errorf("%s: IDEMD_DATABASE_USER_FILE %q, want %q", where, v, wantUser)
		}
		mounted := false
		for _, m := range c.VolumeMounts {
			mounted = mounted || m.Name == "db"
		}
		if !mounted {
			t.Errorf("%s: the extra volume is not mounted", where)
		}
	}
}

// TestSchemaRejects: values.schema.json turns a mistyped value into an
// install error instead of a broken manifest.
func TestSchemaRejects(t *testing.T) {
	for what, values := range map[string]map[string]any{
		"unknown key":                 {"enqueur": map[string]any{"enabled": false}},
		"replicas string":             {"enqueuer": map[string]any{"replicas": "two"}},
		"bad digest":                  {"image": map[string]any{"digest": "latest"}},
		"non-string env":              {"completer": map[string]any{"config": map[string]any{"IDEMD_RATE": 5}}},
		"not a flag env":              {"completer": map[string]any{"config": map[string]any{"DATABASE_URL": "postgres://x"}}},
		"no memory limit":             {"reaper": map[string]any{"resources": map[string]any{"limits": map[string]any{"memory": nil}}}},
		"user file alone":             {"database": map[string]any{"userFile": "/var/run/secrets/db/username"}},
		"unknown daemon config key":   {"completer": map[string]any{"config": map[string]any{"IDEMD_RATEE": "5"}}},
		"another daemon's config key": {"enqueuer": map[string]any{"config": map[string]any{"IDEMD_RATE": "5"}}},
		"common key not every reads":  {"common": map[string]any{"config": map[string]any{"IDEMD_RETENTION": "72h"}}},
		"enum value not the flag's":   {"common": map[string]any{"config": map[string]any{"IDEMD_LOG_FORMAT": "text"}}},
		"unknown component key":       {"enqueuer": map[string]any{"nodeSelectr": map[string]any{"pool": "a"}}},
		"unknown global key":          {"tolerationz": []any{}},
		"unknown serviceAccount key":  {"serviceAccount": map[string]any{"automount": true}},
		"component creates an SA":     {"migrate": map[string]any{"serviceAccount": map[string]any{"create": true}}},
		"unknown networkPolicy key":   {"reaper": map[string]any{"networkPolicy": map[string]any{"egress": []any{}}}},
		"tolerations not a list":      {"tolerations": map[string]any{"key": "a"}},
		"env entry without a name":    {"extraEnv": []any{map[string]any{"value": "x"}}},
		"schedule in words":           {"reaper": map[string]any{"schedule": "every hour please"}},
	} {
		if _, err := tryRenderChart(values); err == nil {
			t.Errorf("%s: %v rendered without error", what, values)
		} else {
			t.Logf("%s: %v", what, err)
		}
	}
}
