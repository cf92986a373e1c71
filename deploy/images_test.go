package deploy

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// TestOverlaysListed keeps the overlays every test renders in step with
// the directories an operator can apply: a new overlay is checked too.
func TestOverlaysListed(t *testing.T) {
	dirs, err := filepath.Glob("overlays/*/kustomization.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var found []string
	for _, d := range dirs {
		found = append(found, filepath.ToSlash(filepath.Dir(d)))
	}
	slices.Sort(found)
	want := slices.Sorted(slices.Values(overlays))
	if !slices.Equal(found, want) {
		t.Errorf("deploy/overlays holds %v, the tests render %v", found, want)
	}
}

// overlayImage is the image an overlay's own kustomization.yaml sets for
// the manifests' `image: idemd`, as name:tag (or name@digest).
func overlayImage(t *testing.T, dir string) string {
	t.Helper()
	var k struct {
		Images []struct {
			Name    string `json:"name"`
			NewName string `json:"newName"`
			NewTag  string `json:"newTag"`
			Digest  string `json:"digest"`
		} `json:"images"`
	}
	if err := yaml.Unmarshal([]byte(readFile(t, filepath.Join(dir, "kustomization.yaml"))), &k); err != nil {
		t.Fatal(err)
	}
	for _, im := range k.Images {
		if im.Name != "idemd" {
			continue
		}
		if im.NewName == "" || (im.NewTag == "" && im.Digest == "") {
			t.Fatalf("%s: the idemd image entry needs newName and newTag (or digest): %+v", dir, im)
		}
		ref := im.NewName
		if im.NewTag != "" {
			ref += ":" + im.NewTag
		}
		if im.Digest != "" {
			ref += "@" + im.Digest
		}
		return ref
	}
	t.Fatalf("%s: kustomization.yaml has no `images: - name: idemd` entry: the overlay would deploy whatever the base says", dir)
	return ""
}

// TestOverlayImages: every container of every workload an overlay renders
// runs the image that overlay's kustomization.yaml names, with kustomize's
// library and with the binary operators use (`kubectl kustomize`, or the
// kustomize CLI scripts/ensure-kustomize.sh builds when kubectl has no
// kustomize v5). An images entry that matches nothing (the base renaming
// `idemd` first) leaves another image in place and fails here.
func TestOverlayImages(t *testing.T) {
	binary := kustomizeBinary(t)
	for _, dir := range overlays {
		t.Run(dir, func(t *testing.T) {
			want := overlayImage(t, dir)
			check := func(how string, r *rendered) {
				n := 0
				for _, w := range r.workloads() {
					for _, c := range append(slices.Clone(w.Pod.Spec.InitContainers), w.Pod.Spec.Containers...) {
						n++
						if c.Image != want {
							t.Errorf("%s (%s): %s container %s runs %q, the overlay sets %q", dir, how, w, c.Name, c.Image, want)
						}
					}
				}
				// enqueuer, completer, console, reaper, reaper dry run, migrate.
				if n < 6 {
					t.Errorf("%s (%s): %d containers rendered, want at least 6", dir, how, n)
				}
			}
			check("kustomize library", render(t, dir))
			if binary != nil {
				out := binary(t, dir)
				check(filepath.Base(out.tool), decodeAll(t, dir, out.yaml))
			}
		})
	}
}

type binaryOutput struct {
	tool string
	yaml []byte
}

var kustomizeVersion = regexp.MustCompile(`(?m)^Kustomize Version: v?([0-9]+)\.`)

// kustomizeBinary returns a renderer running the kustomize v5 binary on
// this machine: kubectl's when it embeds v5, else the kustomize CLI. None:
// CI fails (scripts/ensure-kustomize.sh provides one), elsewhere nil.
func kustomizeBinary(t *testing.T) func(*testing.T, string) binaryOutput {
	t.Helper()
	run := func(tool string, args ...string) func(*testing.T, string) binaryOutput {
		return func(t *testing.T, dir string) binaryOutput {
			t.Helper()
			var stderr bytes.Buffer
			cmd := exec.Command(tool, append(args, dir)...)
			cmd.Stderr = &stderr
			out, err := cmd.Output()
			if err != nil {
				t.Fatalf("%s %v %s: %v\n%s", tool, args, dir, err, stderr.Bytes())
			}
			return binaryOutput{tool: tool, yaml: out}
		}
	}
	if p, err := exec.LookPath("kubectl"); err == nil {
		out, _ := exec.Command(p, "version", "--client").Output()
		if m := kustomizeVersion.FindSubmatch(out); m != nil && atoi(string(m[1])) >= 5 {
			return run(p, "kustomize")
		}
	}
	candidates := []string{"kustomize"}
	if gopath, err := exec.Command("go", "env", "GOPATH").Output(); err == nil {
		candidates = append(candidates, filepath.Join(string(bytes.TrimSpace(gopath)), "bin", "kustomize"))
	}
	for _, c := range candidates {
		if p, err := exec.LookPath(c); err == nil {
			return run(p, "build")
		}
	}
	if os.Getenv("CI") == "true" {
		t.Fatal("no kubectl with kustomize v5 and no kustomize CLI, and CI=true: scripts/ensure-kustomize.sh provides one")
	}
	t.Log("no kustomize v5 binary: checking the library's rendering only (scripts/ensure-kustomize.sh)")
	return nil
}

func atoi(s string) int {
	n, err := strconv.Atoi(s)
	if err != nil {
		return -1
	}
	return n
}

// TestOverlayReleaseTags: the production overlay deploys the released image
// of the release these manifests belong to, the VERSION file's, as the
// release workflow publishes it; the dev overlay names no release at all,
// so neither can disagree with VERSION.
func TestOverlayReleaseTags(t *testing.T) {
	version := strings.TrimSpace(readFile(t, "../VERSION"))
	if got, want := overlayImage(t, "overlays/production"), "ghcr.io/idemd/idemd:"+version; got != want {
		t.Errorf("overlays/production deploys %s, want %s", got, want)
	}
	if got := overlayImage(t, "overlays/dev"); regexp.MustCompile(`:v?\d+\.\d+`).MatchString(got) {
		t.Errorf("overlays/dev deploys %s: a version in its tag would be a second place for the release", got)
	}
}
