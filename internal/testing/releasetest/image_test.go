package releasetest

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"debug/elf"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

type descriptor struct {
	MediaType string `json:"mediaType"`
	Digest    string `json:"digest"`
	Platform  *struct {
		OS           string `json:"os"`
		Architecture string `json:"architecture"`
	} `json:"platform"`
}

// ociArchive is an oci-archive's blobs by digest, and its index.json.
type ociArchive struct {
	index []byte
	blobs map[string][]byte
}

func readOCIArchive(t *testing.T, path string) ociArchive {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	a := ociArchive{blobs: map[string][]byte{}}
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		name := strings.TrimPrefix(h.Name, "./")
		b, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		switch {
		case name == "index.json":
			a.index = b
		case strings.HasPrefix(name, "blobs/sha256/"):
			a.blobs["sha256:"+strings.TrimPrefix(name, "blobs/sha256/")] = b
		}
	}
	if a.index == nil {
		t.Fatalf("%s has no index.json", path)
	}
	return a
}

func (a ociArchive) json(t *testing.T, digest string, v any) {
	t.Helper()
	b, ok := a.blobs[digest]
	if !ok {
		t.Fatalf("the image archive lacks blob %s", digest)
	}
	if err := json.Unmarshal(b, v); err != nil {
		t.Fatalf("blob %s: %v", digest, err)
	}
}

// testImage: the image archive is an OCI index of linux/amd64 and
// linux/arm64 images, each with its architecture's binaries, labels naming
// the version and commit, uid 65532 and idemctl as the entrypoint; and the
// images scripts/release.sh built (the same images, by their config
// digests) start, the arm64 one through qemu.
func testImage(t *testing.T, extra, version, commit string) {
	a := readOCIArchive(t, filepath.Join(extra, fmt.Sprintf("idemd_%s_image.oci.tar", version)))
	var top struct{ Manifests []descriptor }
	if err := json.Unmarshal(a.index, &top); err != nil || len(top.Manifests) != 1 {
		t.Fatalf("index.json: %v, %d entries, want the one image index", err, len(top.Manifests))
	}
	var index struct {
		MediaType string `json:"mediaType"`
		Manifests []descriptor
	}
	a.json(t, top.Manifests[0].Digest, &index)
	if index.MediaType != "application/vnd.oci.image.index.v1+json" {
		t.Errorf("the image is a %q, want an OCI image index", index.MediaType)
	}
	got := map[string]string{} // architecture -> config digest
	for _, m := range index.Manifests {
		if m.Platform == nil || m.Platform.OS != "linux" {
			t.Errorf("index entry %s has platform %v", m.Digest, m.Platform)
			continue
		}
		arch := m.Platform.Architecture
		var manifest struct {
			Config descriptor
			Layers []descriptor
		}
		a.json(t, m.Digest, &manifest)
		var config struct {
			Architecture string `json:"architecture"`
			OS           string `json:"os"`
			Config       struct {
				User       string
				Entrypoint []string
				Labels     map[string]string
			} `json:"config"`
		}
		a.json(t, manifest.Config.Digest, &config)
		got[arch] = manifest.Config.Digest
		if config.Architecture != arch || config.OS != "linux" || config.Config.User != "65532:65532" ||
			strings.Join(config.Config.Entrypoint, " ") != "/usr/local/bin/idemctl" ||
			config.Config.Labels["org.opencontainers.image.version"] != version ||
			config.Config.Labels["org.opencontainers.image.revision"] != commit {
			t.Errorf("linux/%s image config: %s/%s user %q entrypoint %v labels %v", arch, config.OS, config.Architecture,
				config.Config.User, config.Config.Entrypoint, config.Config.Labels)
		}
		machine := map[string]elf.Machine{"amd64": elf.EM_X86_64, "arm64": elf.EM_AARCH64}[arch]
		for _, c := range commands {
			bin := layerFile(t, a, manifest.Layers, "usr/local/bin/"+c)
			f, err := elf.NewFile(bytes.NewReader(bin))
			if err != nil {
				t.Errorf("linux/%s image's %s: %v", arch, c, err)
				continue
			}
			if f.Machine != machine {
				t.Errorf("linux/%s image's %s is for %v", arch, c, f.Machine)
			}
		}
	}
	if len(got) != 2 || got["amd64"] == "" || got["arm64"] == "" {
		t.Fatalf("the image index lists %v, want linux/amd64 and linux/arm64", got)
	}

	// Start each: idemctl --version, as uid 65532 on a read-only root.
	tag := "localhost/idemd:" + strings.ReplaceAll(version, "+", "_")
	for _, arch := range []string{"amd64", "arm64"} {
		image := tag + "-" + arch
		id := strings.TrimSpace(run(t, "", nil, time.Minute, "podman", "image", "inspect", "--format", "{{.Id}}", image))
		if "sha256:"+id != got[arch] {
			t.Errorf("%s is image %s, the archive's linux/%s is %s", image, id, arch, got[arch])
		}
		out, errOut, err := try("", nil, 2*time.Minute, "podman", "run", "--rm", "--runtime", "runc",
			"--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1024:1024", "--read-only", "--user", "65532",
			"--cap-drop", "ALL", "--platform", "linux/"+arch, image, "--version")
		want := regexp.MustCompile(`^idemctl ` + regexp.QuoteMeta(version) + ` \(commit ` + regexp.QuoteMeta(commit) + `, go1\.[0-9.]+\)\n$`)
		if err == nil && want.MatchString(out) {
			continue
		}
		if _, binfmt := os.Stat("/proc/sys/fs/binfmt_misc/qemu-aarch64"); arch == "arm64" && binfmt != nil {
			// Without a binfmt_misc handler the kernel cannot start an
			// aarch64 binary in a container; the config and the binaries'
			// architecture were checked above.
			t.Logf("the linux/arm64 image cannot start on this machine (no binfmt_misc handler for aarch64: %v): %v\n%s", binfmt, err, errOut)
			continue
		}
		t.Errorf("podman run %s --version: %v\nstdout %q, want %s\nstderr: %s", image, err, out, want, errOut)
	}
}

// layerFile returns the content of path in the image's layers (the last
// layer that has it).
func layerFile(t *testing.T, a ociArchive, layers []descriptor, path string) []byte {
	t.Helper()
	var found []byte
	for _, l := range layers {
		b, ok := a.blobs[l.Digest]
		if !ok {
			t.Fatalf("the image archive lacks layer %s", l.Digest)
		}
		var r io.Reader = bytes.NewReader(b)
		if strings.Contains(l.MediaType, "gzip") {
			zr, err := gzip.NewReader(r)
			if err != nil {
				t.Fatal(err)
			}
			r = zr
		}
		tr := tar.NewReader(r)
		for {
			h, err := tr.Next()
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatalf("layer %s: %v", l.Digest, err)
			}
			if strings.TrimPrefix(h.Name, "./") == path {
				if found, err = io.ReadAll(tr); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	if found == nil {
		t.Fatalf("no %s in the image", path)
	}
	return found
}
