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
// Go version matches go.mod, the image stage is FROM scratch with the one
// file system scripts/image-rootfs.sh lays out (every command, built
// statically), uid 65532 and idemctl as the entrypoint, the offline build
// (scripts/build-image.sh) builds exactly that stage, and the build context
// keeps every package the commands import. internal/testing/imagetest builds the
// image offline and runs it.
func TestDockerfile(t *testing.T) {
	df := readFile(t, "Dockerfile")
	gomod := readFile(t, "../go.mod")

	// The Go the project is built and tested with: go.mod's toolchain
	// line, or its go line when it has none.
	goVersion := regexp.MustCompile(`(?m)^toolchain go(\S+)$`).FindStringSubmatch(gomod)
	if goVersion == nil {
		goVersion = regexp.MustCompile(`(?m)^go (\S+)$`).FindStringSubmatch(gomod)
	}
	argVersion := regexp.MustCompile(`(?m)^ARG GO_VERSION=(\S+)$`).FindStringSubmatch(df)
	if goVersion == nil || argVersion == nil || goVersion[1] != argVersion[1] {
		t.Errorf("Dockerfile ARG GO_VERSION %v does not match go.mod's toolchain (or go) line %v", argVersion, goVersion)
	}

	froms := regexp.MustCompile(`(?m)^FROM (\S+)`).FindAllStringSubmatchIndex(df, -1)
	if len(froms) != 2 {
		t.Fatalf("want a build stage and the image stage, got %d FROM lines", len(froms))
	}
	if build := df[froms[0][2]:froms[0][3]]; !strings.HasPrefix(build, "golang:${GO_VERSION}") {
		t.Errorf("build stage FROM %s, want golang:${GO_VERSION}", build)
	}
	if !regexp.MustCompile(`(?m)^\s+IDEMD_VERSION="\$\{VERSION\}" IDEMD_REVISION="\$\{REVISION\}" scripts/image-rootfs\.sh /rootfs$`).MatchString(df) {
		t.Error("the build stage must lay out the image with scripts/image-rootfs.sh /rootfs, as the offline build does, given the VERSION and REVISION arguments")
	}
	// The version is scripts/buildinfo.sh's alone: a default in the
	// Dockerfile could name another release.
	if m := regexp.MustCompile(`(?m)^ARG VERSION\b.*$`).FindAllString(df, -1); len(m) != 3 || slices.ContainsFunc(m, func(s string) bool { return s != "ARG VERSION" }) {
		t.Errorf("Dockerfile's ARG VERSION lines %q: want a bare ARG VERSION (no default) at the top and in each stage", m)
	}
	version := strings.TrimSpace(readFile(t, "../VERSION"))

	// The image stage, without comments and blank lines, each instruction
	// on one line.
	var stage []string
	continued := false
	for _, line := range strings.Split(df[froms[1][0]:], "\n") {
		if line = strings.TrimSpace(line); line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if continued {
			stage[len(stage)-1] += " " + line
		} else {
			stage = append(stage, line)
		}
		continued = strings.HasSuffix(line, "\\")
	}
	wantStage := []string{
		"FROM scratch",
		"ARG VERSION",
		"ARG REVISION",
		`LABEL org.opencontainers.image.title="idemd" \ org.opencontainers.image.version="${VERSION}" \ ` +
			`org.opencontainers.image.revision="${REVISION}" \ org.opencontainers.image.source="https://github.com/idemd/idemd" \ ` +
			`org.opencontainers.image.licenses="Apache-2.0"`,
		"COPY --from=build /rootfs/ /",
		// Numeric so that Kubernetes' runAsNonRoot can verify it.
		"USER 65532:65532",
		`ENTRYPOINT ["/usr/local/bin/idemctl"]`,
		`CMD ["--help"]`,
	}
	if !slices.Equal(stage, wantStage) {
		t.Errorf("image stage:\n%s\nwant:\n%s", strings.Join(stage, "\n"), strings.Join(wantStage, "\n"))
	}

	// The offline build builds the same lines, its rootfs/ in place of the
	// build stage's.
	out, err := exec.Command("../scripts/build-image.sh", "--containerfile").Output()
	if err != nil {
		t.Fatalf("scripts/build-image.sh --containerfile: %v", err)
	}
	wantOffline := strings.Replace(df[froms[1][0]:], "COPY --from=build /rootfs/ /\n", "COPY rootfs/ /\n", 1)
	if string(out) != wantOffline {
		t.Errorf("scripts/build-image.sh builds:\n%s\nnot deploy/Dockerfile's image stage:\n%s", out, wantOffline)
	}
	checkBuildArgs(t, version)

	checkRootfsScript(t)
	checkDockerignore(t)
}

// checkBuildArgs: the offline build gives the image stage's labels the
// version and commit scripts/buildinfo.sh stamps into the binaries: on this
// untagged checkout a development build of the VERSION file's release,
// <VERSION>-dev+<commit> (-dirty for a tree with changes, as this one may be
// while it is tested).
func checkBuildArgs(t *testing.T, version string) {
	t.Helper()
	out, err := exec.Command("../scripts/build-image.sh", "--build-args").Output()
	if err != nil {
		t.Fatalf("scripts/build-image.sh --build-args: %v", err)
	}
	head, err := exec.Command("git", "rev-parse", "--short", "HEAD").Output()
	if err != nil {
		t.Fatalf("git rev-parse: %v", err)
	}
	commit := regexp.QuoteMeta(strings.TrimSpace(string(head))) + `(?:-dirty)?`
	if tag, err := exec.Command("git", "describe", "--tags", "--exact-match", "--match", "v[0-9]*", "HEAD").Output(); err == nil {
		// A release's checkout: the tag's version, which buildinfo.sh
		// checks against VERSION.
		if want := "VERSION=" + strings.TrimPrefix(strings.TrimSpace(string(tag)), "v") + "\n"; !strings.HasPrefix(string(out), want) {
			t.Errorf("scripts/build-image.sh --build-args on tag %s:\n%s", tag, out)
		}
		return
	}
	want := regexp.MustCompile(`^VERSION=` + regexp.QuoteMeta(version) + `-dev\+(` + commit + `)\nREVISION=(` + commit + `)\n$`)
	m := want.FindStringSubmatch(string(out))
	if m == nil || m[1] != m[2] {
		t.Errorf("scripts/build-image.sh --build-args:\n%s\nwant VERSION=%s-dev+<HEAD>[-dirty] and REVISION=<the same>", out, version)
	}
	ldflags, err := exec.Command("../scripts/buildinfo.sh", "ldflags").Output()
	if err != nil {
		t.Fatalf("scripts/buildinfo.sh ldflags: %v", err)
	}
	for _, v := range []string{"buildinfo.version=" + version + "-dev+" + strings.TrimSpace(string(head)), "buildinfo.commit=" + strings.TrimSpace(string(head))} {
		if !strings.Contains(string(ldflags), "github.com/idemd/idemd/internal/"+v) {
			t.Errorf("scripts/buildinfo.sh ldflags %q does not stamp %s", ldflags, v)
		}
	}
}

// checkRootfsScript: scripts/image-rootfs.sh builds every command into
// /usr/local/bin statically, and takes the CA bundle and zoneinfo from
// Debian's paths.
func checkRootfsScript(t *testing.T) {
	t.Helper()
	sh := readFile(t, "../scripts/image-rootfs.sh")
	m := regexp.MustCompile(`(?m)^COMMANDS=\(([^)]*)\)$`).FindStringSubmatch(sh)
	if m == nil {
		t.Fatal("scripts/image-rootfs.sh has no COMMANDS=(...) line")
	}
	if got := strings.Fields(m[1]); !slices.Equal(got, commands) {
		t.Errorf("scripts/image-rootfs.sh builds %v, the deploy tests know %v", got, commands)
	}
	m = regexp.MustCompile(`(?m)^EXAMPLES=\(([^)]*)\)$`).FindStringSubmatch(sh)
	if m == nil {
		t.Fatal("scripts/image-rootfs.sh has no EXAMPLES=(...) line")
	}
	var want []string
	for _, pkg := range examples {
		want = append(want, strings.TrimPrefix(pkg, "./"))
	}
	slices.Sort(want)
	if got := strings.Fields(m[1]); !slices.Equal(got, want) {
		t.Errorf("scripts/image-rootfs.sh builds the examples %v, the deploy tests know %v", got, want)
	}
	for _, want := range []string{
		"CGO_ENABLED=0 GOOS=linux go build -trimpath -ldflags=\"$ldflags\"",
		`ldflags="-s -w $(scripts/buildinfo.sh ldflags)"`,
		`-o "$dest/usr/local/bin/" "${COMMANDS[@]/#/./cmd/}" "${EXAMPLES[@]/#/./}"`,
		"cp /etc/ssl/certs/ca-certificates.crt \"$dest/etc/ssl/certs/\"",
		"cp -a /usr/share/zoneinfo \"$dest/usr/share/\"",
	} {
		if !strings.Contains(sh, want) {
			t.Errorf("scripts/image-rootfs.sh lacks %s", want)
		}
	}
	mains, err := filepath.Glob("../cmd/*/main.go")
	if err != nil {
		t.Fatal(err)
	}
	for _, main := range mains {
		name := filepath.Base(filepath.Dir(main))
		if !slices.Contains(commands, name) {
			t.Errorf("cmd/%s exists but the deploy tests do not know it (commands)", name)
		}
	}
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
	for _, f := range []string{"go.mod", "go.sum", "scripts/image-rootfs.sh", "scripts/buildinfo.sh", "VERSION"} {
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
	for _, pkg := range examples {
		args = append(args, pkg)
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
		rel = filepath.ToSlash(rel)
		ok := false
		for p := range allowed {
			ok = ok || rel == p || strings.HasPrefix(rel, p+"/")
		}
		if !ok {
			t.Errorf("the commands import %s, but Dockerfile.dockerignore does not allow it (or a folder above it)", rel)
		}
	}
}
