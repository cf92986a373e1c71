package externalmodule_test

import (
	"bufio"
	"bytes"
	"context"
	"go/build"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"text/template"
	"time"

	"github.com/idemd/idemd/internal/testing/dbtest"
)

func TestMain(m *testing.M) { dbtest.Main(m) }

// checkout is the repository root, two directories up from this package.
func checkout(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs(filepath.Join("..", "..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	return root
}

// moduleOf reads the module path and the go version of the checkout's
// go.mod: the templates take both from there, so the module path is
// renamed in one place, go.mod itself.
func moduleOf(t *testing.T, root string) (module, goVersion string) {
	t.Helper()
	f, err := os.Open(filepath.Join(root, "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) == 2 && fields[0] == "module" {
			module = strings.Trim(fields[1], `"`)
		}
		if len(fields) == 2 && fields[0] == "go" {
			goVersion = fields[1]
		}
	}
	if module == "" || goVersion == "" {
		t.Fatalf("go.mod: module %q, go %q", module, goVersion)
	}
	return module, goVersion
}

// render writes testdata/api, its templates filled in, to a new directory,
// with the checkout's go.sum: the external module needs the same checksums
// and nothing else, so no checksum database is asked.
func render(t *testing.T, root string) string {
	t.Helper()
	module, goVersion := moduleOf(t, root)
	data := map[string]string{"Module": module, "GoVersion": goVersion, "Checkout": root}
	dir := t.TempDir()
	src := filepath.Join("testdata", "api")
	err := filepath.WalkDir(src, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, err := filepath.Rel(src, path)
		if err != nil {
			return err
		}
		tmpl, err := template.ParseFiles(path)
		if err != nil {
			return err
		}
		var b bytes.Buffer
		if err := tmpl.Execute(&b, data); err != nil {
			return err
		}
		out := filepath.Join(dir, strings.TrimSuffix(rel, ".tmpl"))
		if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
			return err
		}
		return os.WriteFile(out, b.Bytes(), 0o644)
	})
	if err != nil {
		t.Fatal(err)
	}
	sum, err := os.ReadFile(filepath.Join(root, "go.sum"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "go.sum"), sum, 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

func goBin(t *testing.T) string {
	t.Helper()
	if p, err := exec.LookPath("go"); err == nil {
		return p
	}
	// The toolchain the tests run under, when its bin is not on PATH.
	p := filepath.Join(build.Default.GOROOT, "bin", "go")
	if _, err := os.Stat(p); err != nil {
		t.Fatalf("no go command on PATH or in GOROOT: %v", err)
	}
	return p
}

// goCmd runs the go command in dir as a user's build would run there: the
// module graph resolved from go.mod (-mod=mod), from the module cache and
// proxy this build uses, no workspace, no toolchain download.
func goCmd(t *testing.T, dir string, env []string, args ...string) (string, error) {
	t.Helper()
	gobin := goBin(t)
	modcache, err := exec.Command(gobin, "env", "GOMODCACHE").Output()
	if err != nil {
		t.Fatalf("go env GOMODCACHE: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, gobin, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(),
		"GOFLAGS=-mod=mod "+os.Getenv("GOFLAGS"),
		"GOMODCACHE="+strings.TrimSpace(string(modcache)),
		"GOWORK=off",
		"GOTOOLCHAIN=local",
	)
	cmd.Env = append(cmd.Env, env...)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// An API author's module builds, vets and passes its test against
// idemd's schema, importing idem and idem/replayauth through the public
// module path only.
func TestExternalModule(t *testing.T) {
	root := checkout(t)
	dir := render(t, root)
	if out, err := goCmd(t, dir, nil, "build", "./"); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	if out, err := goCmd(t, dir, nil, "vet", "./"); err != nil {
		t.Fatalf("go vet: %v\n%s", err, out)
	}
	dbURL := dbtest.NewDatabase(t)
	out, err := goCmd(t, dir, []string{"DATABASE_URL=" + dbURL}, "test", "-count=1", "-v", "./")
	if err != nil {
		t.Fatalf("go test in the external module: %v\n%s", err, out)
	}
	if !strings.Contains(out, "--- PASS: TestAsAnAPIAuthor") {
		t.Fatalf("the external test did not run:\n%s", out)
	}
}

// What the public packages keep to themselves cannot be reached from
// another module: package forge, each line of which reaches for one of
// them, fails to compile on every one of those lines.
func TestExternalModuleCannotForge(t *testing.T) {
	root := checkout(t)
	dir := render(t, root)
	out, err := goCmd(t, dir, nil, "build", "-gcflags=-e", "./forge")
	if err == nil {
		t.Fatalf("package forge compiled:\n%s", out)
	}
	module, _ := moduleOf(t, root)
	for _, want := range []string{
		`use of internal package ` + module + `/internal/testing/replaytest not allowed`,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("no %q in:\n%s", want, out)
		}
	}
	// The internal import stops the build before type checking; without
	// it, every other line is an error of its own.
	src := filepath.Join(dir, "forge", "forge.go")
	b, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	b = regexp.MustCompile(`(?m)^\s*_ ".*/internal/testing/replaytest"\n`).ReplaceAll(b, nil)
	if err := os.WriteFile(src, b, 0o644); err != nil {
		t.Fatal(err)
	}
	out, err = goCmd(t, dir, nil, "build", "-gcflags=-e", "./forge")
	if err == nil {
		t.Fatalf("package forge compiled without the internal import:\n%s", out)
	}
	t.Logf("go build ./forge:\n%s", out)
	for _, want := range []string{
		"undefined: idem.WithReplayUserID",
		"undefined: replayauth.Parse",
		"s.SignAt undefined",
		"unknown field Now in struct literal",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("no %q in:\n%s", want, out)
		}
	}
}
