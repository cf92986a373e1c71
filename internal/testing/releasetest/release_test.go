package releasetest

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"debug/buildinfo"
	"debug/elf"
	"debug/macho"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"
)

var (
	commands  = []string{"enqueuer", "completer", "reaper", "idemctl"}
	platforms = []struct{ os, arch string }{{"linux", "amd64"}, {"linux", "arm64"}, {"darwin", "amd64"}, {"darwin", "arm64"}}
)

// root is the repository's top directory.
func root(t *testing.T) string {
	t.Helper()
	dir, err := filepath.Abs("../../..")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, ".goreleaser.yaml")); err != nil {
		t.Fatalf("%s is not the repository: %v", dir, err)
	}
	return dir
}

// need fails the test with CI=true when a tool is missing, else skips it.
func need(t *testing.T, installer string, tools ...string) {
	t.Helper()
	for _, tool := range tools {
		if _, err := exec.LookPath(tool); err != nil {
			msg := fmt.Sprintf("no %s on this machine (%s installs it)", tool, installer)
			if os.Getenv("CI") == "true" {
				t.Fatal(msg + "; CI=true: the release test must run")
			}
			t.Skip(msg)
		}
	}
}

// run runs bin with args in dir and returns its standard output; a failure
// or a run longer than timeout fails the test.
func run(t *testing.T, dir string, env []string, timeout time.Duration, bin string, args ...string) string {
	t.Helper()
	out, errOut, err := try(dir, env, timeout, bin, args...)
	if err != nil {
		t.Fatalf("%s %s: %v\n%s%s", bin, strings.Join(args, " "), err, out, errOut)
	}
	return out
}

func try(dir string, env []string, timeout time.Duration, bin string, args ...string) (string, string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	cmd.WaitDelay = 5 * time.Second
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	return out.String(), errOut.String(), err
}

// TestReleaseSnapshot builds the release's artifacts as the release
// workflow does, offline, and checks each.
func TestReleaseSnapshot(t *testing.T) {
	need(t, "scripts/ensure-buildah.sh", "buildah", "podman", "runc")
	need(t, "scripts/ensure-qemu.sh", "qemu-aarch64-static")
	need(t, "scripts/ensure-runtimes.sh", "ruby", "gem", "node", "npm")
	if _, _, err := try("", nil, time.Minute, "/usr/bin/python3", "-c", "import build, setuptools, wheel"); err != nil {
		need(t, "scripts/ensure-runtimes.sh", "python3-build (Debian's python3 with build, setuptools and wheel)")
	}
	dir := root(t)
	version := strings.TrimSpace(run(t, dir, nil, time.Minute, "scripts/buildinfo.sh", "version"))
	commit := strings.TrimSpace(run(t, dir, nil, time.Minute, "scripts/buildinfo.sh", "commit"))
	// scripts/release.sh leaves the image in local storage, as the
	// workflow pushes it from there; a test run's is removed, so that
	// every commit's snapshot does not stay behind.
	tag := "localhost/idemd:" + strings.ReplaceAll(version, "+", "_")
	t.Cleanup(func() {
		_ = exec.Command("buildah", "manifest", "rm", tag).Run()
		_ = exec.Command("buildah", "rmi", tag+"-amd64", tag+"-arm64").Run()
	})
	start := time.Now()
	run(t, dir, nil, 40*time.Minute, "scripts/release.sh", "snapshot")
	t.Logf("scripts/release.sh snapshot: %s (commit %s) in %s", version, commit, time.Since(start).Round(time.Second))
	dist, extra := filepath.Join(dir, "dist"), filepath.Join(dir, "build", "release")

	t.Run("checksums", func(t *testing.T) { testChecksums(t, dist, extra, version) })
	t.Run("binaries", func(t *testing.T) { testBinaries(t, dist, version, commit) })
	t.Run("sboms", func(t *testing.T) { testSBOMs(t, dist, version) })
	t.Run("image", func(t *testing.T) { testImage(t, extra, version, commit) })
	t.Run("packages", func(t *testing.T) { testPackages(t, extra, version) })
	t.Run("manifests", func(t *testing.T) { testArchivedManifests(t, dist, version) })
	t.Run("chart", func(t *testing.T) { testChart(t, dir, extra, version) })
	t.Run("chart-oci", func(t *testing.T) { testChartOCI(t, extra, version) })
	t.Run("image-sboms", func(t *testing.T) { testImageSBOMs(t, extra, version) })
}

// testChecksums: checksums.txt lists every archive, SBOM, the image
// archive and every client package, and each sum is the file's.
func testChecksums(t *testing.T, dist, extra, version string) {
	f, err := os.Open(filepath.Join(dist, "checksums.txt"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	listed := map[string]bool{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		sum, name, ok := strings.Cut(sc.Text(), "  ")
		if !ok {
			t.Fatalf("checksums.txt line %q is not \"<sha256>  <file>\"", sc.Text())
		}
		path := filepath.Join(dist, name)
		if _, err := os.Stat(path); err != nil {
			path = filepath.Join(extra, name)
		}
		b, err := os.ReadFile(path)
		if err != nil {
			t.Errorf("checksums.txt lists %s, which the release does not hold: %v", name, err)
			continue
		}
		if got := sha256.Sum256(b); hex.EncodeToString(got[:]) != sum {
			t.Errorf("%s: sha256 %x, checksums.txt says %s", name, got, sum)
		}
		listed[name] = true
	}
	var want []string
	for _, p := range platforms {
		want = append(want, fmt.Sprintf("idemd_%s_%s_%s.tar.gz", version, p.os, p.arch))
		for _, c := range commands {
			want = append(want, fmt.Sprintf("%s_%s_%s_%s.cdx.json", c, version, p.os, p.arch))
		}
	}
	extras, _ := filepath.Glob(filepath.Join(extra, "*"))
	for _, e := range extras {
		want = append(want, filepath.Base(e))
	}
	// The image archive and its 2 SBOMs, the chart and its OCI layout, the
	// gem, sdist, wheel and npm tarball.
	if len(extras) < 9 {
		t.Errorf("build/release holds %d files, want the image archive and its 2 SBOMs, the chart and its OCI layout, and 4 client packages", len(extras))
	}
	for _, w := range want {
		if !listed[w] {
			t.Errorf("checksums.txt does not list %s", w)
		}
	}
}

// testBinaries: each archive holds the four commands of its platform. The
// linux ones run --version (arm64 through qemu-aarch64-static); the darwin
// ones cannot run here, so their Mach-O architecture and the build
// information Go embedded (the -X stamps, GOOS, GOARCH) are read instead.
func testBinaries(t *testing.T, dist, version, commit string) {
	for _, p := range platforms {
		t.Run(p.os+"_"+p.arch, func(t *testing.T) {
			dir := t.TempDir()
			untar(t, filepath.Join(dist, fmt.Sprintf("idemd_%s_%s_%s.tar.gz", version, p.os, p.arch)), dir)
			files := []string{"LICENSE", "README.md", "CHANGELOG.md", "SECURITY.md"}
			// The SQL the docs tell an operator to run with psql, at the
			// same paths as in the repository.
			sqlFiles, err := filepath.Glob(filepath.Join(root(t), "deploy", "sql", "*.sql"))
			if err != nil || len(sqlFiles) == 0 {
				t.Fatalf("no deploy/sql/*.sql in the repository: %v", err)
			}
			for _, f := range sqlFiles {
				files = append(files, filepath.Join("deploy", "sql", filepath.Base(f)))
			}
			for _, f := range files {
				if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
					t.Errorf("the archive lacks %s", f)
				}
			}
			for _, c := range commands {
				bin := filepath.Join(dir, c)
				checkArch(t, bin, p.os, p.arch)
				checkBuildInfo(t, bin, p.os, p.arch, version, commit)
				if p.os != "linux" {
					continue
				}
				var out string
				if p.arch == "arm64" {
					out = run(t, dir, nil, time.Minute, "qemu-aarch64-static", bin, "--version")
				} else {
					out = run(t, dir, nil, time.Minute, bin, "--version")
				}
				want := regexp.MustCompile(`^` + c + ` ` + regexp.QuoteMeta(version) + ` \(commit ` + regexp.QuoteMeta(commit) + `, go1\.[0-9.]+\)\n$`)
				if !want.MatchString(out) {
					t.Errorf("%s/%s %s --version: %q, want %s", p.os, p.arch, c, out, want)
				}
			}
		})
	}
}

func checkArch(t *testing.T, bin, goos, goarch string) {
	t.Helper()
	switch goos {
	case "linux":
		f, err := elf.Open(bin)
		if err != nil {
			t.Fatalf("%s: %v", bin, err)
		}
		defer f.Close()
		want := map[string]elf.Machine{"amd64": elf.EM_X86_64, "arm64": elf.EM_AARCH64}[goarch]
		if f.Machine != want {
			t.Errorf("%s: ELF machine %v, want %v", bin, f.Machine, want)
		}
	case "darwin":
		f, err := macho.Open(bin)
		if err != nil {
			t.Fatalf("%s: %v", bin, err)
		}
		defer f.Close()
		want := map[string]macho.Cpu{"amd64": macho.CpuAmd64, "arm64": macho.CpuArm64}[goarch]
		if f.Cpu != want {
			t.Errorf("%s: Mach-O CPU %v, want %v", bin, f.Cpu, want)
		}
	}
}

// checkBuildInfo reads what `go version -m` shows: the build's GOOS,
// GOARCH, CGO_ENABLED=0 and -trimpath, and the main module. The -ldflags
// are not among them (Go leaves them out of a -trimpath build), so the
// version and commit stamped into internal/buildinfo are looked for in the
// binary itself, where -X puts them as string data: a darwin binary cannot
// run here to print them.
func checkBuildInfo(t *testing.T, bin, goos, goarch, version, commit string) {
	t.Helper()
	info, err := buildinfo.ReadFile(bin)
	if err != nil {
		t.Fatalf("%s: %v", bin, err)
	}
	settings := map[string]string{}
	for _, s := range info.Settings {
		settings[s.Key] = s.Value
	}
	for k, want := range map[string]string{"GOOS": goos, "GOARCH": goarch, "CGO_ENABLED": "0", "-trimpath": "true"} {
		if settings[k] != want {
			t.Errorf("%s: build setting %s=%q, want %q", bin, k, settings[k], want)
		}
	}
	if info.Main.Path != "github.com/idemd/idemd" {
		t.Errorf("%s: main module %q", bin, info.Main.Path)
	}
	b, err := os.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{version, commit} {
		if !bytes.Contains(b, []byte(want)) {
			t.Errorf("%s does not hold the stamped %q", bin, want)
		}
	}
}

// testSBOMs: each binary's SBOM is CycloneDX, names the binary's module
// and lists the modules linked into it.
func testSBOMs(t *testing.T, dist, version string) {
	for _, p := range platforms {
		for _, c := range commands {
			name := fmt.Sprintf("%s_%s_%s_%s.cdx.json", c, version, p.os, p.arch)
			b, err := os.ReadFile(filepath.Join(dist, name))
			if err != nil {
				t.Error(err)
				continue
			}
			var bom struct {
				BOMFormat string `json:"bomFormat"`
				Metadata  struct {
					Component struct{ Name string } `json:"component"`
				} `json:"metadata"`
				Components []struct {
					Name    string `json:"name"`
					Version string `json:"version"`
					PURL    string `json:"purl"`
				} `json:"components"`
			}
			if err := json.Unmarshal(b, &bom); err != nil {
				t.Errorf("%s: %v", name, err)
				continue
			}
			var names []string
			for _, comp := range bom.Components {
				names = append(names, comp.Name)
			}
			if bom.BOMFormat != "CycloneDX" || !strings.Contains(bom.Metadata.Component.Name, "github.com/idemd/idemd") ||
				!slices.Contains(names, "github.com/jackc/pgx/v5") {
				t.Errorf("%s: format %q, component %q, %d components (want CycloneDX, idemd's module, pgx among them)",
					name, bom.BOMFormat, bom.Metadata.Component.Name, len(names))
			}
		}
	}
}

// TestPublishNeedsARelease: `scripts/release.sh publish` on a checkout that
// is not a clean release tag refuses before building anything, so the
// workflow can never publish a development build under a release's name.
func TestPublishNeedsARelease(t *testing.T) {
	dir := root(t)
	version := strings.TrimSpace(run(t, dir, nil, time.Minute, "scripts/buildinfo.sh", "version"))
	if !strings.Contains(version, "-dev+") {
		t.Skipf("this checkout is the release %s: publishing it is allowed", version)
	}
	out, errOut, err := try(dir, nil, time.Minute, "scripts/release.sh", "publish")
	if err == nil || !strings.Contains(errOut, "is not a release") {
		t.Errorf("scripts/release.sh publish on %s: %v\nstdout: %s\nstderr: %s", version, err, out, errOut)
	}
}
