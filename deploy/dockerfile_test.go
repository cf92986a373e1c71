package deploy

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// TestDockerfile checks what can be checked without a Docker daemon: the
// Go version matches go.mod, every command is built statically into the
// nonroot distroless image, and the build context keeps every package the
// commands import.
func TestDockerfile(t *testing.T) {
	df := readFile(t, "Dockerfile")
	gomod := readFile(t, "../go.mod")

	goVersion := regexp.MustCompile(`(?m)^go (\S+)$`).FindStringSubmatch(gomod)
	argVersion := regexp.MustCompile(`(?m)^ARG GO_VERSION=(\S+)$`).FindStringSubmatch(df)
	if goVersion == nil || argVersion == nil || goVersion[1] != argVersion[1] {
		t.Errorf("Dockerfile ARG GO_VERSION %v does not match go.mod's go directive %v", argVersion, goVersion)
	}

	froms := regexp.MustCompile(`(?m)^FROM (\S+)`).FindAllStringSubmatch(df, -1)
	if len(froms) < 2 {
		t.Fatalf("want a multi-stage build, got FROM lines %v", froms)
	}
	final := froms[len(froms)-1][1]
	if final != "gcr.io/distroless/static-debian12:nonroot" {
		t.Errorf("final stage %s, want gcr.io/distroless/static-debian12:nonroot", final)
	}
	for _, f := range froms {
		if strings.HasSuffix(f[1], ":latest") || !strings.Contains(f[1], ":") {
			t.Errorf("FROM %s is not pinned to a tag", f[1])
		}
	}
	if !strings.Contains(df, "CGO_ENABLED=0") {
		t.Error("binaries must be built with CGO_ENABLED=0: distroless/static has no libc")
	}
	if !regexp.MustCompile(`(?m)^USER 65532:65532$`).MatchString(df) {
		t.Error("the image must run as USER 65532:65532 (numeric, so runAsNonRoot can verify it)")
	}

	mains, err := filepath.Glob("../cmd/*/main.go")
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range mains {
		name := filepath.Base(filepath.Dir(m))
		if !slices.Contains(commands, name) {
			t.Errorf("cmd/%s exists but the deploy tests do not know it (commands)", name)
		}
	}
	for _, c := range commands {
		if !strings.Contains(df, "./cmd/"+c) {
			t.Errorf("Dockerfile does not build ./cmd/%s", c)
		}
	}

	checkDockerignore(t)
}

// checkDockerignore: the allow-list in Dockerfile.dockerignore must keep
// every top-level directory of a package the commands import.
func checkDockerignore(t *testing.T) {
	t.Helper()
	allowed := map[string]bool{}
	for _, line := range strings.Split(readFile(t, "Dockerfile.dockerignore"), "\n") {
		if p, ok := strings.CutPrefix(strings.TrimSpace(line), "!"); ok {
			allowed[strings.TrimSuffix(p, "/")] = true
		}
	}
	for _, f := range []string{"go.mod", "go.sum"} {
		if !allowed[f] {
			t.Errorf("Dockerfile.dockerignore excludes %s", f)
		}
	}
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	var args []string
	for _, c := range commands {
		if _, err := os.Stat(filepath.Join(root, "cmd", c, "main.go")); err == nil {
			args = append(args, "./cmd/"+c)
		}
	}
	cmd := exec.Command("go", append([]string{"list", "-deps", "-f", "{{if not .Standard}}{{.Dir}}{{end}}"}, args...)...)
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	for _, dir := range strings.Fields(string(out)) {
		rel, err := filepath.Rel(root, dir)
		if err != nil || strings.HasPrefix(rel, "..") {
			continue // a module dependency, downloaded in the image
		}
		top := strings.SplitN(filepath.ToSlash(rel), "/", 2)[0]
		if !allowed[top] {
			t.Errorf("the commands import %s, but Dockerfile.dockerignore does not allow %s/", rel, top)
		}
	}
}
