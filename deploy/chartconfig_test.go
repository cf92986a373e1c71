package deploy

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/alecthomas/kong"

	"github.com/idemd/idemd/internal/completer"
	"github.com/idemd/idemd/internal/config"
	"github.com/idemd/idemd/internal/ctl"
	"github.com/idemd/idemd/internal/enqueuer"
	"github.com/idemd/idemd/internal/reaper"
)

var updateChartSchema = flag.Bool("update", false, "rewrite the config definitions of helm/idemd/values.schema.json from the commands' flags")

const chartSchemaPath = "helm/idemd/values.schema.json"

// chartCommand is a command a chart component's config feeds: its CLI
// model and the subcommand the container runs.
type chartCommand struct {
	name string
	cli  any
	path []string
}

// chartConfigs are the chart's config values by component, with the
// commands each one's ConfigMap or env reaches: common.config reaches
// every command the chart runs, the migration's `idemctl migrate` too.
var chartConfigs = map[string][]chartCommand{
	"enqueuer":  {{"enqueuer", &enqueuer.Command{}, nil}},
	"completer": {{"completer", &completer.Command{}, nil}},
	"reaper":    {{"reaper", &reaper.Command{}, nil}},
	"console":   {{"idemctl", &ctl.CLI{}, []string{"console"}}},
	"common": {
		{"enqueuer", &enqueuer.Command{}, nil}, {"completer", &completer.Command{}, nil}, {"reaper", &reaper.Command{}, nil},
		{"idemctl", &ctl.CLI{}, []string{"console"}}, {"idemctl", &ctl.CLI{}, []string{"migrate"}},
	},
}

// commandEnvs returns the IDEMD_* variables a command reads (kong maps
// every flag to one; config.Model is the model config.Parse parses with),
// each as its schema: a string, described by the flag's help, one of the
// flag's enum values if it has one.
func commandEnvs(c chartCommand) (map[string]map[string]any, error) {
	app, err := config.Model(c.name, c.cli)
	if err != nil {
		return nil, err
	}
	node := app.Node
	for _, word := range c.path {
		var next *kong.Node
		for _, child := range node.Children {
			if child.Name == word {
				next = child
			}
		}
		if next == nil {
			return nil, fmt.Errorf("%s has no command %q", c.name, word)
		}
		node = next
	}
	out := map[string]map[string]any{}
	for _, group := range node.AllFlags(false) {
		for _, f := range group {
			for _, env := range f.Envs {
				if !strings.HasPrefix(env, config.EnvPrefix+"_") {
					continue
				}
				prop := map[string]any{"type": "string", "description": fmt.Sprintf("--%s: %s", f.Name, f.Help)}
				if f.Enum != "" {
					prop["enum"] = f.EnumSlice()
				}
				out[env] = prop
			}
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%s %s reads no %s_* variable", c.name, strings.Join(c.path, " "), config.EnvPrefix)
	}
	return out, nil
}

// configDefinition is the schema of one component's config: exactly the
// variables every command it reaches reads.
func configDefinition(component string) (map[string]any, error) {
	var known map[string]map[string]any
	var names []string
	for _, c := range chartConfigs[component] {
		envs, err := commandEnvs(c)
		if err != nil {
			return nil, err
		}
		names = append(names, strings.TrimSpace(c.name+" "+strings.Join(c.path, " ")))
		if known == nil {
			known = envs
			continue
		}
		for k := range known {
			if _, ok := envs[k]; !ok {
				delete(known, k)
			}
		}
	}
	props := map[string]any{}
	for k, prop := range known {
		props[k] = prop
	}
	who := "only the variables it reads"
	if len(names) > 1 {
		who = "only the variables every one of them reads"
	}
	return map[string]any{
		"description": fmt.Sprintf("Environment (IDEMD_<FLAG>) of %s: %s, each a string "+
			"(generated from the flags by deploy/chartconfig_test.go; see `<command> --help`).", strings.Join(names, ", "), who),
		"type":                 "object",
		"additionalProperties": false,
		"properties":           props,
	}, nil
}

// chartSchema returns values.schema.json with each component's config
// definition generated from the commands' flags, as the file must be.
func chartSchema(raw []byte) ([]byte, error) {
	var schema map[string]any
	if err := json.Unmarshal(raw, &schema); err != nil {
		return nil, fmt.Errorf("chart schema: %w", err)
	}
	defs, _ := schema["definitions"].(map[string]any)
	props, _ := schema["properties"].(map[string]any)
	if defs == nil || props == nil {
		return nil, fmt.Errorf("chart schema: no definitions or properties")
	}
	delete(defs, "config")
	for _, component := range slices.Sorted(maps.Keys(chartConfigs)) {
		def, err := configDefinition(component)
		if err != nil {
			return nil, err
		}
		defs[component+"Config"] = def
		p, _ := props[component].(map[string]any)
		pp, _ := p["properties"].(map[string]any)
		if pp == nil {
			return nil, fmt.Errorf("chart schema: no properties of %s", component)
		}
		pp["config"] = map[string]any{"$ref": "#/definitions/" + component + "Config"}
	}
	var out bytes.Buffer
	enc := json.NewEncoder(&out)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	if err := enc.Encode(schema); err != nil {
		return nil, err
	}
	return out.Bytes(), nil
}

// TestChartConfigKeysMatchFlags: the chart's schema refuses any config key
// the command it reaches does not read (kong ignores an unknown variable,
// so IDEMD_RATEE=5 would leave the completer at its default rate
// silently). Each component's list is generated from the commands' own
// flag definitions; after a flag is added or renamed,
// `go test ./deploy -run TestChartConfigKeysMatchFlags -update` rewrites it.
func TestChartConfigKeysMatchFlags(t *testing.T) {
	raw, err := os.ReadFile(chartSchemaPath)
	if err != nil {
		t.Fatal(err)
	}
	want, err := chartSchema(raw)
	if err != nil {
		t.Fatal(err)
	}
	if *updateChartSchema {
		if err := os.WriteFile(chartSchemaPath, want, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	if !bytes.Equal(raw, want) {
		t.Errorf("deploy/%s is not what the commands' flags give%s: run go test ./deploy -run TestChartConfigKeysMatchFlags -update and review the diff",
			chartSchemaPath, configKeyDiff(t, raw, want))
	}
	// The lists hold what the chart's defaults set, and not the typo.
	for component, keys := range map[string][]string{
		"completer": {"IDEMD_RATE", "IDEMD_API_URL", "IDEMD_CONCURRENCY", "IDEMD_HTTP_ADDR"},
		"reaper":    {"IDEMD_RETENTION", "IDEMD_MAX_RUNTIME", "IDEMD_SCHEDULE"},
		"console":   {"IDEMD_LISTEN", "IDEMD_RETENTION"},
		"common":    {"IDEMD_LOG_FORMAT", "IDEMD_LOG_LEVEL", "IDEMD_POOLER"},
	} {
		def, err := configDefinition(component)
		if err != nil {
			t.Fatal(err)
		}
		props := def["properties"].(map[string]any)
		for _, k := range keys {
			if _, ok := props[k]; !ok {
				t.Errorf("%s.config: %s missing from the generated list", component, k)
			}
		}
		if _, ok := props["IDEMD_RATEE"]; ok {
			t.Errorf("%s.config: IDEMD_RATEE is in the list", component)
		}
	}
	// common is what every command reads: not the completer's rate.
	def, err := configDefinition("common")
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := def["properties"].(map[string]any)["IDEMD_RATE"]; ok {
		t.Error("common.config admits IDEMD_RATE, which only the completer reads")
	}
}

// configKeyDiff names the config keys the schema file has and the flags do
// not give, and the other way round.
func configKeyDiff(t *testing.T, have, want []byte) string {
	t.Helper()
	keys := func(raw []byte) map[string][]string {
		var schema struct {
			Definitions map[string]struct {
				Properties map[string]any `json:"properties"`
			} `json:"definitions"`
		}
		if err := json.Unmarshal(raw, &schema); err != nil {
			t.Fatal(err)
		}
		out := map[string][]string{}
		for component := range chartConfigs {
			out[component] = slices.Sorted(maps.Keys(schema.Definitions[component+"Config"].Properties))
		}
		return out
	}
	h, w := keys(have), keys(want)
	var diffs []string
	for _, component := range slices.Sorted(maps.Keys(chartConfigs)) {
		for _, k := range h[component] {
			if !slices.Contains(w[component], k) {
				diffs = append(diffs, fmt.Sprintf("%s.config admits %s, which no flag reads", component, k))
			}
		}
		for _, k := range w[component] {
			if !slices.Contains(h[component], k) {
				diffs = append(diffs, fmt.Sprintf("%s.config lacks %s", component, k))
			}
		}
	}
	if len(diffs) == 0 {
		return ""
	}
	return " (" + strings.Join(diffs, "; ") + ")"
}
