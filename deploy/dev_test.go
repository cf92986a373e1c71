package deploy

import (
	"net"
	"net/url"
	"regexp"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
)

// makeImage is the image `make image` builds: the Makefile's IMAGE.
func makeImage(t *testing.T) string {
	t.Helper()
	m := regexp.MustCompile(`(?m)^IMAGE \?= (\S+)$`).FindStringSubmatch(readFile(t, "../Makefile"))
	if m == nil {
		t.Fatal("the Makefile sets no IMAGE ?= ...")
	}
	return m[1]
}

// devPassword matches the dev passwords the postgres image's init script
// gives the login roles.
var devPassword = regexp.MustCompile(`(?m)^ALTER ROLE (\w+) PASSWORD '([^']*)';$`)

// TestDevOverlayRunsAsShipped: the dev overlay is self-contained on a bare
// kind or k3d cluster: its idemd containers run the image `make image`
// builds; every ConfigMap, Secret and key its pods reference is rendered
// (nothing created out of band); its database URLs name the rendered
// PostgreSQL Service, its port, its database, and roles whose passwords the
// PostgreSQL's init scripts set; and those scripts run deploy/sql/roles.sql
// as it is.
func TestDevOverlayRunsAsShipped(t *testing.T) {
	const dir = "overlays/dev"
	r := render(t, dir)
	if got, want := overlayImage(t, dir), makeImage(t); got != want {
		t.Errorf("%s deploys %s, `make image` builds %s", dir, got, want)
	}

	// Every reference resolves inside the render.
	for _, w := range r.pods() {
		spec := w.Pod.Spec
		for _, v := range spec.Volumes {
			switch {
			case v.ConfigMap != nil:
				if _, ok := r.configData("ConfigMap", v.ConfigMap.Name); !ok {
					t.Errorf("%s: volume %s: ConfigMap %s is not rendered", w, v.Name, v.ConfigMap.Name)
				}
			case v.Secret != nil:
				if _, ok := r.configData("Secret", v.Secret.SecretName); !ok {
					t.Errorf("%s: volume %s: Secret %s is not rendered", w, v.Name, v.Secret.SecretName)
				}
			}
		}
		if sa := spec.ServiceAccountName; sa != "" {
			if _, ok := r.find("ServiceAccount", sa); !ok {
				t.Errorf("%s: ServiceAccount %s is not rendered", w, sa)
			}
		}
		for _, c := range spec.Containers {
			for _, from := range c.EnvFrom {
				if ref := from.ConfigMapRef; ref != nil {
					if _, ok := r.configData("ConfigMap", ref.Name); !ok {
						t.Errorf("%s: container %s: envFrom ConfigMap %s is not rendered", w, c.Name, ref.Name)
					}
				}
				if ref := from.SecretRef; ref != nil {
					if _, ok := r.configData("Secret", ref.Name); !ok {
						t.Errorf("%s: container %s: envFrom Secret %s is not rendered", w, c.Name, ref.Name)
					}
				}
			}
			for _, e := range c.Env {
				if e.ValueFrom == nil || e.ValueFrom.SecretKeyRef == nil {
					continue
				}
				ref := e.ValueFrom.SecretKeyRef
				data, ok := r.configData("Secret", ref.Name)
				if _, has := data[ref.Key]; !ok || !has {
					t.Errorf("%s: container %s: %s from Secret %s key %s, which is not rendered", w, c.Name, e.Name, ref.Name, ref.Key)
				}
			}
		}
	}

	// The database the URLs name is the one the overlay runs.
	o, ok := r.find("StatefulSet", "postgres")
	if !ok {
		t.Fatal("the dev overlay renders no StatefulSet postgres")
	}
	pg := o.Obj.(*appsv1.StatefulSet)
	pgEnv := r.containerEnv(t, &pg.Spec.Template.Spec.Containers[0])
	so, ok := r.find("Service", "postgres")
	if !ok {
		t.Fatal("the dev overlay renders no Service postgres")
	}
	svc := so.Obj.(*corev1.Service)
	for k, v := range svc.Spec.Selector {
		if pg.Spec.Template.Labels[k] != v {
			t.Errorf("Service postgres selects %s=%s, which the StatefulSet's pods do not carry", k, v)
		}
	}
	// The init scripts' ConfigMap, by the (hashed) name the pod mounts.
	var init map[string]string
	for _, v := range pg.Spec.Template.Spec.Volumes {
		if v.ConfigMap != nil && strings.HasPrefix(v.ConfigMap.Name, "postgres-initdb") {
			init, _ = r.configData("ConfigMap", v.ConfigMap.Name)
		}
	}
	if init == nil {
		t.Fatal("the PostgreSQL mounts no rendered ConfigMap postgres-initdb")
	}
	if init["00-roles.sql"] != readFile(t, "sql/roles.sql") {
		t.Error("overlays/dev/initdb/00-roles.sql differs from deploy/sql/roles.sql: cp deploy/sql/roles.sql deploy/overlays/dev/initdb/00-roles.sql")
	}
	passwords := map[string]string{}
	for _, m := range devPassword.FindAllStringSubmatch(init["01-dev-passwords.sql"], -1) {
		passwords[m[1]] = m[2]
	}
	// The Secret the enqueuer reads DATABASE_URL from (generated, hashed).
	var secret map[string]string
	if eo, ok := r.find("Deployment", "idemd-enqueuer"); ok {
		for _, e := range eo.Obj.(*appsv1.Deployment).Spec.Template.Spec.Containers[0].Env {
			if e.Name == "DATABASE_URL" && e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil {
				secret, _ = r.configData("Secret", e.ValueFrom.SecretKeyRef.Name)
			}
		}
	}
	if secret == nil {
		t.Fatal("the dev overlay renders no Secret the enqueuer's DATABASE_URL comes from")
	}
	for key, role := range map[string]string{"DATABASE_URL": "idemd_runtime", "MIGRATE_DATABASE_URL": "idemd_migrator"} {
		u, err := url.Parse(secret[key])
		if err != nil || u.User == nil {
			t.Errorf("%s: %q does not parse with a user: %v", key, secret[key], err)
			continue
		}
		pw, _ := u.User.Password()
		if u.User.Username() != role {
			t.Errorf("%s logs in as %s, want %s", key, u.User.Username(), role)
		}
		if want, set := passwords[role]; !set || pw != want {
			t.Errorf("%s: the password of %s is not the one the init script sets (set: %v)", key, role, set)
		}
		host, port, _ := net.SplitHostPort(u.Host)
		if want := svc.Name + "." + so.Namespace + ".svc.cluster.local"; host != want {
			t.Errorf("%s: host %s, want the rendered Service %s", key, host, want)
		}
		if len(svc.Spec.Ports) == 0 || atoi(port) != int(svc.Spec.Ports[0].Port) {
			t.Errorf("%s: port %s is not the Service's", key, port)
		}
		if db := strings.TrimPrefix(u.Path, "/"); db != pgEnv["POSTGRES_DB"] {
			t.Errorf("%s: database %s, the PostgreSQL creates %s", key, db, pgEnv["POSTGRES_DB"])
		}
	}
}
