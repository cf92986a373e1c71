package releasetest

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"
)

// What a platform team installs besides the binaries: the manifests and
// the docs in every archive, the chart packaged and as the OCI artifact the
// workflow pushes and signs, the image's SBOM of each architecture.

// archivedTrees are the repository's directories every archive carries,
// whole (but the deploy tests' Go files): the kustomize tree, the Flux
// example, the chart's source and the docs.
var archivedTrees = []string{
	"deploy/base", "deploy/components", "deploy/overlays", "deploy/observability",
	"deploy/flux", "deploy/helm/idemd", "docs",
}

// trackedFiles lists the files git tracks under the archived trees.
func trackedFiles(t *testing.T, dir string) []string {
	t.Helper()
	out := run(t, dir, nil, time.Minute, "git", append([]string{"ls-files", "--"}, archivedTrees...)...)
	var files []string
	for _, f := range strings.Split(strings.TrimSpace(out), "\n") {
		if f != "" && !strings.HasSuffix(f, "_test.go") {
			files = append(files, f)
		}
	}
	if len(files) < 40 {
		t.Fatalf("git ls-files %v: %d files: not the trees this test expects", archivedTrees, len(files))
	}
	return files
}

// testArchivedManifests: each archive holds every file of the archived
// trees as the repository has it, and from the unpacked archive alone the
// production overlay and both halves of the Flux example render.
func testArchivedManifests(t *testing.T, dist, version string) {
	dir := root(t)
	files := trackedFiles(t, dir)
	for _, p := range platforms {
		t.Run(p.os+"_"+p.arch, func(t *testing.T) {
			unpacked := t.TempDir()
			untar(t, filepath.Join(dist, fmt.Sprintf("idemd_%s_%s_%s.tar.gz", version, p.os, p.arch)), unpacked)
			for _, f := range files {
				want, err := os.ReadFile(filepath.Join(dir, f))
				if err != nil {
					t.Fatal(err)
				}
				got, err := os.ReadFile(filepath.Join(unpacked, f))
				if err != nil {
					t.Errorf("the archive lacks %s", f)
					continue
				}
				if !bytes.Equal(got, want) {
					t.Errorf("%s in the archive differs from the repository's", f)
				}
			}
			if p.os != "linux" || p.arch != "amd64" {
				return // the same files: rendering them once is enough
			}
			for _, k := range []string{"deploy/overlays/production", "deploy/flux/migrate", "deploy/flux/daemons", "deploy/flux"} {
				m, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(filesys.MakeFsOnDisk(), filepath.Join(unpacked, k))
				if err != nil {
					t.Errorf("kustomize build %s from the unpacked archive: %v", k, err)
					continue
				}
				if m.Size() == 0 {
					t.Errorf("kustomize build %s from the unpacked archive: no objects", k)
				}
			}
		})
	}
}

// imageTag is the tag of a version's image, and so its chart's appVersion:
// a release's is its version; a development build's has "_" for "+".
func imageTag(version string) string { return strings.ReplaceAll(version, "+", "_") }

// testChart: the packaged chart is the repository's chart at the
// release's version, and it renders with the release's image.
func testChart(t *testing.T, dir, extra, version string) {
	tgz := filepath.Join(extra, "idemd-"+version+".tgz")
	var chartYAML []byte
	walkTar(t, tgz, func(h *tar.Header, r io.Reader) {
		if h.Name == "idemd/Chart.yaml" {
			chartYAML, _ = io.ReadAll(r)
		}
	})
	var meta struct {
		Name       string `json:"name"`
		Version    string `json:"version"`
		AppVersion string `json:"appVersion"`
	}
	if err := yaml.Unmarshal(chartYAML, &meta); err != nil || meta.Name != "idemd" {
		t.Fatalf("%s: idemd/Chart.yaml %q: %v", tgz, chartYAML, err)
	}
	if meta.Version != version || meta.AppVersion != imageTag(version) {
		t.Errorf("%s: version %q appVersion %q, want %q and %q", tgz, meta.Version, meta.AppVersion, version, imageTag(version))
	}
	helm := filepath.Join(dir, "bin", "tools", "helm")
	out := run(t, dir, nil, 2*time.Minute, helm, "template", "idemd", tgz, "--namespace", "idemd",
		"--set", "completer.config.IDEMD_API_URL=http://api.payments.svc.cluster.local:8080")
	want := "image: ghcr.io/idemd/idemd:" + imageTag(version)
	if n := strings.Count(out, want); n < 4 {
		t.Errorf("helm template %s: %d containers with %q, want every workload's (at least 4)", tgz, n, want)
	}
}

type ociDescriptor struct {
	MediaType   string            `json:"mediaType"`
	Digest      string            `json:"digest"`
	Size        int64             `json:"size"`
	Annotations map[string]string `json:"annotations"`
}

// testChartOCI: the layout the workflow copies to the registry holds, under
// the chart's tag, the manifest Helm's registry client makes of the
// packaged chart: Helm's config (the chart's metadata) and its chart layer,
// byte for byte the .tgz; every blob is what its digest says.
func testChartOCI(t *testing.T, extra, version string) {
	blobs := map[string][]byte{}
	var index struct {
		Manifests []ociDescriptor `json:"manifests"`
	}
	var layoutFile []byte
	f, err := os.Open(filepath.Join(extra, "idemd-chart_"+version+".oci.tar"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		name := strings.TrimPrefix(h.Name, "./")
		switch {
		case name == "index.json":
			if err := json.Unmarshal(b, &index); err != nil {
				t.Fatalf("index.json: %v", err)
			}
		case name == "oci-layout":
			layoutFile = b
		case strings.HasPrefix(name, "blobs/sha256/") && h.Typeflag == tar.TypeReg:
			sum := sha256.Sum256(b)
			digest := "sha256:" + strings.TrimPrefix(name, "blobs/sha256/")
			if "sha256:"+hex.EncodeToString(sum[:]) != digest {
				t.Errorf("blob %s: content's sha256 is %x", digest, sum)
			}
			blobs[digest] = b
		}
	}
	if !bytes.Contains(layoutFile, []byte(`"imageLayoutVersion":"1.0.0"`)) {
		t.Errorf("oci-layout %q: not an OCI image layout", layoutFile)
	}
	var manifestDesc *ociDescriptor
	for i, m := range index.Manifests {
		if m.Annotations["org.opencontainers.image.ref.name"] == imageTag(version) {
			manifestDesc = &index.Manifests[i]
		}
	}
	if manifestDesc == nil || manifestDesc.MediaType != "application/vnd.oci.image.manifest.v1+json" {
		t.Fatalf("index.json %+v: no image manifest tagged %s", index, imageTag(version))
	}
	var manifest struct {
		SchemaVersion int               `json:"schemaVersion"`
		Config        ociDescriptor     `json:"config"`
		Layers        []ociDescriptor   `json:"layers"`
		Annotations   map[string]string `json:"annotations"`
	}
	if err := json.Unmarshal(blobs[manifestDesc.Digest], &manifest); err != nil {
		t.Fatalf("manifest %s: %v", manifestDesc.Digest, err)
	}
	if manifest.Config.MediaType != "application/vnd.cncf.helm.config.v1+json" {
		t.Errorf("config media type %q, not Helm's", manifest.Config.MediaType)
	}
	var config struct{ Name, Version, AppVersion string }
	if err := json.Unmarshal(blobs[manifest.Config.Digest], &config); err != nil || config.Name != "idemd" || config.Version != version {
		t.Errorf("config %s: %+v (%v), want the chart idemd %s", manifest.Config.Digest, config, err, version)
	}
	tgz, err := os.ReadFile(filepath.Join(extra, "idemd-"+version+".tgz"))
	if err != nil {
		t.Fatal(err)
	}
	if len(manifest.Layers) != 1 || manifest.Layers[0].MediaType != "application/vnd.cncf.helm.chart.content.v1.tar+gzip" ||
		!bytes.Equal(blobs[manifest.Layers[0].Digest], tgz) {
		t.Errorf("layers %+v: want one Helm chart layer, the packaged chart byte for byte", manifest.Layers)
	}
	if manifest.Annotations["org.opencontainers.image.title"] != "idemd" || manifest.Annotations["org.opencontainers.image.version"] != version {
		t.Errorf("manifest annotations %v: want Helm's title and version", manifest.Annotations)
	}
	if _, err := time.Parse(time.RFC3339, manifest.Annotations["org.opencontainers.image.created"]); err != nil {
		t.Errorf("manifest annotations: created %q: %v", manifest.Annotations["org.opencontainers.image.created"], err)
	}
}

// testImageSBOMs: an SBOM per architecture of the image, naming the image
// and listing what its binaries linked (pgx, River) at that architecture.
func testImageSBOMs(t *testing.T, extra, version string) {
	for _, arch := range []string{"amd64", "arm64"} {
		name := fmt.Sprintf("idemd_%s_image_linux_%s.cdx.json", version, arch)
		b, err := os.ReadFile(filepath.Join(extra, name))
		if err != nil {
			t.Error(err)
			continue
		}
		var bom struct {
			BOMFormat string `json:"bomFormat"`
			Metadata  struct {
				Component struct {
					Name    string `json:"name"`
					Version string `json:"version"`
				} `json:"component"`
			} `json:"metadata"`
			Components []struct {
				Name       string `json:"name"`
				Version    string `json:"version"`
				PURL       string `json:"purl"`
				Properties []struct {
					Name  string `json:"name"`
					Value string `json:"value"`
				} `json:"properties"`
			} `json:"components"`
		}
		if err := json.Unmarshal(b, &bom); err != nil {
			t.Errorf("%s: %v", name, err)
			continue
		}
		if bom.BOMFormat != "CycloneDX" || bom.Metadata.Component.Name != "ghcr.io/idemd/idemd" || bom.Metadata.Component.Version != imageTag(version) {
			t.Errorf("%s: format %q, component %s %s: want CycloneDX of ghcr.io/idemd/idemd %s", name, bom.BOMFormat,
				bom.Metadata.Component.Name, bom.Metadata.Component.Version, imageTag(version))
		}
		var names []string
		archs := map[string]bool{}
		binaries := map[string]bool{} // where idemd's own module was found
		for _, c := range bom.Components {
			names = append(names, c.Name)
			props := map[string]string{}
			var paths []string // syft merges a package found in several files
			for _, p := range c.Properties {
				props[p.Name] = p.Value
				if strings.HasPrefix(p.Name, "syft:location:") && strings.HasSuffix(p.Name, ":path") {
					paths = append(paths, p.Value)
				}
			}
			if a, ok := props["syft:metadata:architecture"]; ok {
				archs[a] = true
			}
			if props["syft:metadata:mainModule"] == "github.com/idemd/idemd" {
				for _, p := range paths {
					binaries[p] = true
				}
			}
		}
		for _, want := range []string{"github.com/jackc/pgx/v5", "github.com/riverqueue/river"} {
			if !slices.Contains(names, want) {
				t.Errorf("%s: no component %s among %d", name, want, len(names))
			}
		}
		if len(archs) != 1 || !archs[arch] {
			t.Errorf("%s: the binaries' architectures %v, want only %s", name, archs, arch)
		}
		for _, c := range commands {
			if !binaries["/usr/local/bin/"+c] {
				t.Errorf("%s: no module of /usr/local/bin/%s (idemd's binaries found: %v)", name, c, binaries)
			}
		}
	}
}

// exprs are GitHub's ${{ ... }} expressions in a workflow's scripts.
var exprs = regexp.MustCompile(`\$\{\{[^}]*\}\}`)

// TestReleaseWorkflow: the workflow publishes nothing before CI's checks
// (.ci/run, the script CI runs) have passed on the tag, and it pushes and
// signs the chart artifact the release built, and attests the image's
// SBOMs. These steps need the registry and Sigstore, so only their wiring
// can be checked here; the artifacts they publish are checked above.
func TestReleaseWorkflow(t *testing.T) {
	dir := root(t)
	b, err := os.ReadFile(filepath.Join(dir, ".github", "workflows", "release.yml"))
	if err != nil {
		t.Fatal(err)
	}
	var wf struct {
		Jobs map[string]struct {
			Needs any `json:"needs"`
			Steps []struct {
				Name string `json:"name"`
				Uses string `json:"uses"`
				Run  string `json:"run"`
			} `json:"steps"`
		} `json:"jobs"`
	}
	if err := yaml.Unmarshal(b, &wf); err != nil {
		t.Fatal(err)
	}
	checks, ok := wf.Jobs["checks"]
	if !ok {
		t.Fatal("release.yml has no job checks")
	}
	ranCI := false
	for _, s := range checks.Steps {
		if strings.Contains(s.Run, "bash .ci/run") {
			ranCI = true
		}
	}
	if !ranCI {
		t.Error("release.yml: job checks does not run .ci/run, CI's script")
	}
	ci, err := os.ReadFile(filepath.Join(dir, ".ci", "run"))
	if err != nil || !bytes.Contains(ci, []byte("make test")) || !bytes.Contains(ci, []byte("make lint")) {
		t.Errorf(".ci/run: %v: it no longer runs the lint and make test", err)
	}
	var publishing string
	for name, j := range wf.Jobs {
		if name == "checks" {
			continue
		}
		needs := fmt.Sprint(j.Needs)
		if !strings.Contains(needs, "checks") {
			t.Errorf("release.yml: job %s does not need checks (needs: %s): it could publish what CI's checks fail", name, needs)
		}
		for _, s := range j.Steps {
			publishing += s.Run + "\n"
		}
	}
	for _, want := range []string{
		"scripts/release.sh publish",
		`oras cp --from-oci-layout "$layout:$VERSION" "ghcr.io/idemd/charts/idemd:$VERSION"`,
		`cosign sign "ghcr.io/idemd/charts/idemd@$digest"`,
		`cosign sign --recursive "ghcr.io/idemd/idemd@$DIGEST"`,
		"cosign attest --type cyclonedx",
		`idemd_${VERSION}_image_linux_${arch}.cdx.json`,
		`idemd-chart_${VERSION}.oci.tar`,
	} {
		if !strings.Contains(publishing, want) {
			t.Errorf("release.yml: no step runs %s", want)
		}
	}
	if _, err := exec.LookPath("bash"); err != nil {
		t.Skip("no bash to check the workflow's scripts' syntax")
	}
	for name, j := range wf.Jobs {
		for _, s := range j.Steps {
			if s.Run == "" {
				continue
			}
			// GitHub's expressions are substituted before bash sees the
			// script; a placeholder keeps bash's syntax check meaningful.
			script := exprs.ReplaceAllString(s.Run, "x")
			if _, errOut, err := try(dir, nil, time.Minute, "bash", "-n", "-c", script); err != nil {
				t.Errorf("release.yml: job %s, step %q: bash -n: %v\n%s", name, s.Name, err, errOut)
			}
		}
	}
}
