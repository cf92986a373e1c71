package docscheck

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/alecthomas/kong"

	"github.com/idemd/idemd/examples/rocketrides/server"
	"github.com/idemd/idemd/internal/completer"
	"github.com/idemd/idemd/internal/ctl"
	"github.com/idemd/idemd/internal/enqueuer"
	"github.com/idemd/idemd/internal/reaper"
)

// allowedFlags are flags the pages name that belong to other tools, each
// with the reason it is not idemd's. Keep it short: every entry is a name
// the check can no longer catch being wrong.
var allowedFlags = map[string]string{
	// kubectl, as the operations guide runs it.
	"dry-run":          "kubectl (--dry-run=client); the reaper's own --dry-run is found in its flags too",
	"from-file":        "kubectl create secret --from-file",
	"from-literal":     "kubectl create secret --from-literal",
	"for":              "kubectl wait --for",
	"timeout":          "kubectl wait --timeout",
	"selector":         "kubectl -l/--selector",
	"context":          "kubectl --context",
	"namespace":        "kubectl --namespace",
	"rm":               "podman/kubectl run --rm",
	"build-arg":        "docker build --build-arg REVISION=... (the image's revision label)",
	"runtime":          "podman --runtime runc",
	"ulimit":           "podman --ulimit",
	"read-only":        "podman --read-only",
	"network":          "podman --network host",
	"entrypoint":       "podman --entrypoint",
	"restart":          "kubectl run --restart",
	"image":            "kubectl run --image",
	"overrides":        "kubectl run --overrides",
	"attach":           "kubectl run --attach",
	"stdin":            "kubectl run --stdin",
	"tty":              "kubectl run --tty",
	"quiet":            "psql/apt --quiet",
	"from":             "kubectl create job --from=cronjob/...",
	"ignore-not-found": "kubectl delete --ignore-not-found",
	"force":            "kubectl apply --force (recreates the migration Job)",
	"set":              "helm install/upgrade --set",
	"reuse-values":     "helm upgrade --reuse-values",
	// other tools the pages run.
	"stats":             "pg_waldump --stats",
	"test":              "node --test (clients/node)",
	"set-xauthrequest":  "oauth2-proxy, in front of the console",
	"pass-user-headers": "oauth2-proxy, in front of the console",
	// go.
	"bench":    "go test -bench",
	"tags":     "go test -tags e2e",
	"trimpath": "go build -trimpath",
	// promtool.
	"run": "promtool test rules --run",
}

// allowedDeployments are kubectl deploy/<name> references to Deployments
// that deploy/ does not define, each with its reason.
var allowedDeployments = map[string]string{
	"idemd-console": "docs/console.md port-forwards to a console Deployment that the manifests do not define (yet): owned by the manifests' rework, remove this entry when it lands",
}

// clientNames are the IDEMD_ variables the other-language clients and
// their tests read, and the command-line flags their example APIs define
// ("--x" literals: argparse, OptionParser, parseArgs), in clients/ruby (config.ru too),
// clients/python and clients/node.
func clientNames(t *testing.T) (envs, flags map[string]bool) {
	t.Helper()
	envs, flags = map[string]bool{}, map[string]bool{}
	err := filepath.WalkDir(filepath.Join(root, "clients"), func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && d.Name() == "node_modules" {
			return filepath.SkipDir
		}
		switch filepath.Ext(p) {
		case ".rb", ".ru", ".py", ".js":
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			for _, e := range docEnv.FindAllString(string(b), -1) {
				envs[e] = true
			}
			for _, m := range flagLiteral.FindAllStringSubmatch(string(b), -1) {
				flags[m[1]] = true
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("walk clients: %v", err)
	}
	return envs, flags
}

// flagsOf builds cli's parser the way the binaries do (config.Parse) and
// returns every flag name of every command and subcommand (--no-x for a
// negatable x) and every environment variable kong reads.
func flagsOf(t *testing.T, name string, cli any, flags, envs map[string]string) {
	t.Helper()
	model := commandModel(t, name, cli)
	var walk func(n *kong.Node)
	walk = func(n *kong.Node) {
		for _, f := range n.Flags {
			flags[f.Name] = name
			if f.Tag != nil && f.Tag.Negatable != "" {
				flags["no-"+f.Name] = name
			}
			for _, e := range f.Envs {
				envs[e] = name
			}
		}
		for _, c := range n.Children {
			walk(c)
		}
	}
	walk(model.Node)
}

// goSources returns the text of every .go file under root, tests too (the
// benchmarks' knobs are read there, and the tests' sleeps): the one walk
// of the repository's Go files for every check here.
func goSources(t *testing.T) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			switch d.Name() {
			case ".git", "node_modules", "vendor", "bin":
				return filepath.SkipDir
			}
		}
		if !d.IsDir() && strings.HasSuffix(p, ".go") {
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			out[p] = string(b)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("walk sources: %v", err)
	}
	return out
}

var (
	docFlag   = regexp.MustCompile("(?:^|[\\s`(\\[|,;=\"'])--([a-z][a-z0-9]*(?:-[a-z0-9]+)*)")
	docEnv    = regexp.MustCompile(`\bIDEMD_[A-Z0-9_]*[A-Z0-9]\b`)
	docMetric = regexp.MustCompile(`\bidemd_[a-z0-9_]+`)
	docPath   = regexp.MustCompile(`\bdeploy/[A-Za-z0-9_./*-]*`)

	// Flags of the other Go commands (the benchmark report's, say),
	// which use the standard flag package.
	goFlagDef = regexp.MustCompile(`flag\.(?:String|Int|Int64|Bool|Duration|Float64|Uint)(?:Var)?\((?:[^,()]+, )?"([a-z][a-z0-9-]*)"`)
	// Struct tags of kong commands that are package main (the simulator).
	kongNameTag    = regexp.MustCompile("`[^`]*\\bname:\"([a-z][a-z0-9-]*)\"[^`]*`")
	flagLiteral    = regexp.MustCompile(`["']--([a-z][a-z0-9-]*)["']`)
	goIdentLiteral = regexp.MustCompile(`"(idemd_[a-z0-9_]+)"`)
	envLiteral     = regexp.MustCompile(`"(IDEMD_[A-Z0-9_]+)"`)
	// Metrics registered with the Prometheus client: their Opts' Name, or
	// a collector's own Desc.
	metricDef = regexp.MustCompile(`(?:Name:\s*|NewDesc\(\s*)"(idemd_[a-z0-9_]+)"`)
	// Names of the database objects idemd creates (tables, indexes,
	// triggers, roles, channels), from the migrations and the roles file.
	sqlIdent = regexp.MustCompile(`\bidemd_[a-z0-9_]+`)
	// A name shaped like a metric: it must then be a registered one.
	metricShaped = regexp.MustCompile(`^idemd_(?:enqueuer|completer|reaper|river|dbstats)_|_(?:total|seconds|bucket|count|sum|bytes)$`)
)

// TestDocReferencesExist: every flag (--x), environment variable
// (IDEMD_X), metric (idemd_x) and manifest path (deploy/x) that README.md
// or a page under docs/ names exists in the commands, the registered
// metrics, the migrations or the tree.
func TestDocReferencesExist(t *testing.T) {
	flags, envs := map[string]string{}, map[string]string{}
	flagsOf(t, "enqueuer", &enqueuer.Command{}, flags, envs)
	flagsOf(t, "completer", &completer.Command{}, flags, envs)
	flagsOf(t, "reaper", &reaper.Command{}, flags, envs)
	flagsOf(t, "idemctl", &ctl.CLI{}, flags, envs)
	flagsOf(t, "rocketrides", &server.Command{}, flags, envs)
	for _, must := range []string{"batch-size", "auth-secret-file", "dry-run", "help"} {
		if flags[must] == "" {
			t.Fatalf("the commands' models lack --%s: the model walk is broken", must)
		}
	}

	metrics := map[string]bool{}
	codeNames := map[string]bool{} // "idemd_..." literals of the code: metadata keys, tables
	for p, src := range goSources(t) {
		for _, m := range goFlagDef.FindAllStringSubmatch(src, -1) {
			flags[m[1]] = p
		}
		if strings.HasSuffix(p, "_test.go") {
			for _, m := range envLiteral.FindAllStringSubmatch(src, -1) {
				envs[m[1]] = p
			}
			continue
		}
		for _, m := range kongNameTag.FindAllStringSubmatch(src, -1) {
			flags[m[1]] = p
		}
		for _, m := range envLiteral.FindAllStringSubmatch(src, -1) {
			envs[m[1]] = p
		}
		for _, m := range metricDef.FindAllStringSubmatch(src, -1) {
			metrics[m[1]] = true
		}
		for _, m := range goIdentLiteral.FindAllStringSubmatch(src, -1) {
			codeNames[m[1]] = true
		}
	}
	if !metrics["idemd_enqueuer_jobs_moved_total"] || !metrics["idemd_river_jobs"] {
		t.Fatalf("registered metrics not found in the sources (%d found): the pattern is broken", len(metrics))
	}

	clientEnvs, clientFlags := clientNames(t)
	for e := range clientEnvs {
		envs[e] = "clients/"
	}
	for f := range clientFlags {
		flags[f] = "clients/"
	}

	sqlNames := map[string]bool{}
	sqlFiles, err := filepath.Glob(filepath.Join(root, "migrations", "*.sql"))
	if err != nil || len(sqlFiles) == 0 {
		t.Fatalf("no migrations found: %v", err)
	}
	sqlFiles = append(sqlFiles, filepath.Join(root, "deploy", "sql", "roles.sql"), filepath.Join(root, "deploy", "sql", "runtime-roles-in-turn.sql"))
	for _, f := range sqlFiles {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range sqlIdent.FindAllString(string(b), -1) {
			sqlNames[m] = true
		}
	}

	for n := range codeNames {
		if !metricShaped.MatchString(n) {
			sqlNames[n] = true
		}
	}
	// A primary key's index is named by PostgreSQL, not by the migrations.
	for n := range sqlNames {
		sqlNames[n+"_pkey"] = true
	}

	deployments := deploymentNames(t)
	for name, why := range allowedDeployments {
		if why == "" {
			t.Fatalf("allowedDeployments[%q] says no reason", name)
		}
		deployments[name] = true
	}

	for _, p := range docPages(t) {
		for i, line := range strings.Split(p.text, "\n") {
			where := func(format string, args ...any) {
				t.Helper()
				t.Errorf("%s:%d: "+format, append([]any{p.path, i + 1}, args...)...)
			}
			for _, m := range docFlag.FindAllStringSubmatch(line, -1) {
				if flags[m[1]] == "" && allowedFlags[m[1]] == "" {
					where("--%s is no flag of idemd's commands (nor allowed as another tool's in allowedFlags)", m[1])
				}
			}
			for _, e := range docEnv.FindAllString(line, -1) {
				if envs[e] == "" {
					where("%s is read by no command or test", e)
				}
			}
			for _, m := range docMetric.FindAllString(line, -1) {
				if !metricKnown(m, metrics, sqlNames) {
					where("%s is no registered metric (nor a database object of the migrations)", m)
				}
			}
			for _, d := range docPath.FindAllString(line, -1) {
				if !deployPathExists(d, deployments) {
					where("%s does not exist in the tree (nor is it a Deployment of the manifests)", d)
				}
			}
		}
	}
}

// metricKnown: a registered metric (a histogram's _bucket, _sum and _count
// included), a metric-name prefix ending in "_", or, if it is not shaped
// like a metric, a name the migrations create.
func metricKnown(name string, metrics, sqlNames map[string]bool) bool {
	if metrics[name] {
		return true
	}
	for _, suffix := range []string{"_bucket", "_sum", "_count"} {
		if base, ok := strings.CutSuffix(name, suffix); ok && metrics[base] {
			return true
		}
	}
	if strings.HasSuffix(name, "_") {
		for m := range metrics {
			if strings.HasPrefix(m, name) {
				return true
			}
		}
	}
	if sqlNames[name] {
		return true
	}
	return !metricShaped.MatchString(name) && sqlLike(name)
}

// sqlLike: names that are neither metrics nor in the migrations but that
// the pages legitimately name (each with its reason).
func sqlLike(name string) bool {
	return map[string]bool{
		"idemd_api":        true, // a role of deploy/sql/roles.sql's (created through a variable there)
		"idemd_demo":       true, // make demo's database name (scripts/demo.sh)
		"idemd_adopt":      true, // docs/adopt.md's database name
		"idemd_replayauth": true, // the Python client's package (clients/python)
	}[name]
}

// deployPathExists: a path under deploy/ (a glob, or a directory given as
// deploy/...), or kubectl's deploy/<name> for a Deployment the manifests
// define.
func deployPathExists(ref string, deployments map[string]bool) bool {
	ref = strings.TrimRight(ref, ".,:;")
	if strings.HasSuffix(ref, "/..") || ref == "deploy" {
		ref = "deploy"
	}
	if name, ok := strings.CutPrefix(ref, "deploy/"); ok && deployments[name] {
		return true
	}
	matches, err := filepath.Glob(filepath.Join(root, filepath.FromSlash(ref)))
	return err == nil && len(matches) > 0
}

var deploymentName = regexp.MustCompile(`(?m)^kind: Deployment\s*\nmetadata:\s*\n(?:\s+.*\n)*?\s+name: (\S+)`)

// deploymentNames are the Deployments defined under deploy/.
func deploymentNames(t *testing.T) map[string]bool {
	t.Helper()
	out := map[string]bool{}
	err := filepath.WalkDir(filepath.Join(root, "deploy"), func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(p, ".yaml") {
			return err
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		for _, doc := range strings.Split(string(b), "\n---") {
			for _, m := range deploymentName.FindAllStringSubmatch(strings.TrimLeft(doc, "\n"), -1) {
				out[m[1]] = true
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if !out["idemd-completer"] {
		t.Fatalf("no Deployment idemd-completer found under deploy/ (found %v): the pattern is broken", sortedKeys(out))
	}
	return out
}
