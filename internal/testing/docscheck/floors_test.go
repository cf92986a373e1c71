package docscheck

import (
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/idemd/idemd/internal/completer"
	"github.com/idemd/idemd/internal/ctl"
	"github.com/idemd/idemd/internal/enqueuer"
	"github.com/idemd/idemd/internal/reaper"
)

// schemaFloors is each command's oldest schema, from its code.
func schemaFloors() map[string]int64 {
	return map[string]int64{
		"enqueuer":  enqueuer.OldestSchema,
		"completer": completer.OldestSchema,
		"reaper":    reaper.OldestSchema,
		"idemctl":   ctl.OldestSchema,
	}
}

// floorStatement is where a page states the commands' oldest schemas:
// "(`OldestSchema`: the enqueuer 21, the reaper 30, ...)".
var floorStatement = regexp.MustCompile("`OldestSchema`:\\s*([^)]*)\\)")

// floorPair is one "command N" of such a statement.
var floorPair = regexp.MustCompile(`(enqueuer|completer|reaper|idemctl)\s+(\d+)`)

// TestDocsSchemaFloorsAgreeWithCode: every page that states the commands'
// oldest schemas (docs/operations.md, "Schema versions") states each
// command's, and the number is its code's OldestSchema.
func TestDocsSchemaFloorsAgreeWithCode(t *testing.T) {
	floors := schemaFloors()
	found := 0
	for _, p := range docPages(t) {
		for _, m := range floorStatement.FindAllStringSubmatch(p.text, -1) {
			found++
			stated := map[string]int64{}
			for _, pair := range floorPair.FindAllStringSubmatch(m[1], -1) {
				n, err := strconv.ParseInt(pair[2], 10, 64)
				if err != nil {
					t.Fatal(err)
				}
				stated[pair[1]] = n
			}
			for cmd, floor := range floors {
				got, ok := stated[cmd]
				switch {
				case !ok:
					t.Errorf("%s states the oldest schemas (%q) without the %s's (%d)", p.path, m[1], cmd, floor)
				case got != floor:
					t.Errorf("%s says the %s's oldest schema is %d; its code's OldestSchema is %d", p.path, cmd, got, floor)
				}
			}
		}
	}
	if found == 0 {
		t.Error("no page states the commands' oldest schemas as \"(`OldestSchema`: the enqueuer N, ...)\"; docs/operations.md did: update this test with its new wording")
	}
}

// chartKubeVersion is the lowest Kubernetes minor the chart's kubeVersion
// admits: ">=1.30.0-0" is "1.30".
func chartKubeVersion(t *testing.T) string {
	t.Helper()
	charts, err := filepath.Glob(filepath.Join(root, "deploy", "helm", "*", "Chart.yaml"))
	if err != nil || len(charts) != 1 {
		t.Fatalf("deploy/helm/*/Chart.yaml: %v, %d charts; want one", err, len(charts))
	}
	b, err := os.ReadFile(charts[0])
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^kubeVersion:\s*"?>=\s*v?(\d+\.\d+)\.\d+(?:-0)?"?\s*$`).FindStringSubmatch(string(b))
	if m == nil {
		t.Fatalf("%s: no kubeVersion of the form \">=1.N.0-0\": update this test with the chart's constraint", charts[0])
	}
	return m[1]
}

// TestReadmeKubernetesVersionIsTheChartsKubeVersion: README's "Supported
// versions" gives the oldest Kubernetes the chart's kubeVersion admits,
// and no other oldest version.
func TestReadmeKubernetesVersionIsTheChartsKubeVersion(t *testing.T) {
	want := chartKubeVersion(t)
	b, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	var row string
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, "| Kubernetes |") {
			row = line
		}
	}
	if row == "" {
		t.Fatal("README.md has no \"| Kubernetes |\" row in its supported versions")
	}
	cells := strings.Split(row, "|")
	if len(cells) < 4 {
		t.Fatalf("README.md's Kubernetes row has no version cell: %q", row)
	}
	versions := regexp.MustCompile(`(\d+\.\d+)\+?\s+or\s+newer|(\d+\.\d+)\+`).FindAllStringSubmatch(cells[2], -1)
	if len(versions) == 0 {
		t.Fatalf("README.md's Kubernetes version %q states no \"1.N or newer\"", cells[2])
	}
	for _, v := range versions {
		got := v[1] + v[2]
		if got != want {
			t.Errorf("README.md says Kubernetes %s or newer (%q); the chart's kubeVersion admits %s and newer", got, strings.TrimSpace(cells[2]), want)
		}
	}
}
