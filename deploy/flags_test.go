package deploy

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
)

// commands are the binaries the image ships (deploy/Dockerfile), by the
// name their manifests invoke them with (/usr/local/bin/<name>).
var commands = []string{"enqueuer", "completer", "reaper", "idemctl"}

// examples are the example binaries the image also ships (EXAMPLES in
// scripts/image-rootfs.sh), by name, with their packages: Rocket Rides, which
// the dev overlay runs.
var examples = map[string]string{"rocketrides": "./examples/rocketrides/cmd/rocketrides"}

// imageBinaries is every /usr/local/bin/<name> of the image.
func imageBinaries() []string {
	out := slices.Clone(commands)
	for name := range examples {
		out = append(out, name)
	}
	slices.Sort(out)
	return out
}

// binDir holds the built commands; TestMain removes it.
var binDir string

// binaries builds every command once per test binary run.
var binaries = sync.OnceValues(func() (string, error) {
	dir, err := os.MkdirTemp("", "idemd-deploy-bin-")
	if err != nil {
		return "", err
	}
	binDir = dir
	args := []string{"build", "-o", dir + string(filepath.Separator)}
	for _, c := range commands {
		if _, err := os.Stat(filepath.Join("..", "cmd", c, "main.go")); err != nil {
			return dir, fmt.Errorf("cmd/%s/main.go: %w", c, err)
		}
		args = append(args, "./cmd/"+c)
	}
	for _, pkg := range examples {
		args = append(args, pkg)
	}
	cmd := exec.Command("go", args...)
	cmd.Dir = ".."
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		return dir, fmt.Errorf("go build: %v\n%s", err, out)
	}
	return dir, nil
})

func buildBinaries(t *testing.T) string {
	t.Helper()
	dir, err := binaries()
	if err != nil {
		t.Fatal(err)
	}
	return dir
}

// cliSpec is what a command's --help says it accepts.
type cliSpec struct {
	Flags    map[string]bool // flag name -> takes a value
	Envs     map[string]bool // environment variables kong reads
	Commands []string        // subcommand paths, e.g. "migrate", "review list"
}

var (
	helpCache   = map[string]*cliSpec{}
	helpCacheMu sync.Mutex

	flagLine = regexp.MustCompile(`^\s+(?:-\S, )?--(\[no-\])?([a-z0-9][a-z0-9-]*)(=)?`)
	envRef   = regexp.MustCompile(`\$([A-Z][A-Z0-9_]*)`)
	cmdLine  = regexp.MustCompile(`^  (\S.*?)(?:\s{2,}|$)`)
)

// helpFor runs `<bin> <cmdPath...> --help` and parses kong's output.
func helpFor(t *testing.T, bin string, cmdPath []string) *cliSpec {
	t.Helper()
	key := bin + " " + strings.Join(cmdPath, " ")
	helpCacheMu.Lock()
	defer helpCacheMu.Unlock()
	if s, ok := helpCache[key]; ok {
		return s
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, append(slices.Clone(cmdPath), "--help")...)
	cmd.Env = []string{} // help must not depend on the environment
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s --help: %v\n%s", key, err, out)
	}
	s := parseHelp(out)
	if len(s.Flags) == 0 {
		t.Fatalf("%s --help lists no flags:\n%s", key, out)
	}
	helpCache[key] = s
	return s
}

func parseHelp(out []byte) *cliSpec {
	s := &cliSpec{Flags: map[string]bool{}, Envs: map[string]bool{}}
	inCommands := false
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasSuffix(line, ":") && !strings.HasPrefix(line, " "):
			inCommands = line == "Commands:"
			continue
		case line == "":
			continue
		}
		if m := flagLine.FindStringSubmatch(line); m != nil {
			s.Flags[m[2]] = m[3] == "="
			if m[1] != "" {
				s.Flags["no-"+m[2]] = false
			}
		}
		for _, m := range envRef.FindAllStringSubmatch(line, -1) {
			s.Envs[m[1]] = true
		}
		if inCommands {
			if m := cmdLine.FindStringSubmatch(line); m != nil {
				var words []string
				for _, w := range strings.Fields(m[1]) {
					if strings.HasPrefix(w, "<") || strings.HasPrefix(w, "[") {
						break
					}
					words = append(words, w)
				}
				if len(words) > 0 {
					s.Commands = append(s.Commands, strings.Join(words, " "))
				}
			}
		}
	}
	return s
}

// TestHelpParser pins the parser to kong's help layout, so a change in it
// shows up here rather than as a vacuous flag check.
func TestHelpParser(t *testing.T) {
	s := parseHelp([]byte(`Usage: idemctl <command> [flags]

Flags:
  -h, --help                   Show context-sensitive help.
      --database-url=STRING    PostgreSQL connection URL (env DATABASE_URL).
                               Required ($DATABASE_URL).
      --log-format="json"      Log encoding ($IDEMD_LOG_FORMAT).
      --[no-]color             Colour ($IDEMD_COLOR).
      --once                   One pass ($IDEMD_ONCE).

Commands:
  migrate                 Apply migrations.
  review list             List reviews.
  review resolve <id>     Resolve one.

Run "idemctl <command> --help" for more information on a command.
`))
	wantFlags := map[string]bool{"help": false, "database-url": true, "log-format": true, "color": false, "no-color": false, "once": false}
	if fmt.Sprint(s.Flags) != fmt.Sprint(wantFlags) {
		t.Errorf("flags %v, want %v", s.Flags, wantFlags)
	}
	for _, e := range []string{"DATABASE_URL", "IDEMD_LOG_FORMAT", "IDEMD_COLOR", "IDEMD_ONCE"} {
		if !s.Envs[e] {
			t.Errorf("env %s not found in %v", e, s.Envs)
		}
	}
	if want := []string{"migrate", "review list", "review resolve"}; !slices.Equal(s.Commands, want) {
		t.Errorf("commands %q, want %q", s.Commands, want)
	}
}

// TestContainersMatchBinaryFlags builds every command and checks, for every
// container in every overlay, that its command is a binary the image ships,
// every --flag in its args is one that binary (or subcommand) accepts, and
// every IDEMD_* / DATABASE_URL variable it gets is one kong reads. kong
// ignores unknown environment variables, so without this a renamed flag
// would leave a ConfigMap setting silently without effect.
func TestContainersMatchBinaryFlags(t *testing.T) {
	bindir := buildBinaries(t)
	for _, dir := range overlays {
		t.Run(dir, func(t *testing.T) {
			r := render(t, dir)
			image := overlayImage(t, dir)
			// Every container of idemd's image, the dev overlay's Rocket
			// Rides included; not another image's (its PostgreSQL).
			for _, w := range r.pods() {
				for _, c := range w.Pod.Spec.Containers {
					if c.Image == image {
						checkContainerFlags(t, r, w, &c, bindir)
					}
				}
			}
		})
	}
}

func checkContainerFlags(t *testing.T, r *rendered, w workload, c *corev1.Container, bindir string) {
	t.Helper()
	if len(c.Command) != 1 || path.Dir(c.Command[0]) != "/usr/local/bin" || !slices.Contains(imageBinaries(), path.Base(c.Command[0])) {
		t.Errorf("%s: container %s: command %v is not one of /usr/local/bin/{%s}", w, c.Name, c.Command, strings.Join(imageBinaries(), ","))
		return
	}
	bin := filepath.Join(bindir, path.Base(c.Command[0]))
	cmdPath, spec := resolveCommand(t, bin, c.Args)
	for i := 0; i < len(c.Args); i++ {
		a := c.Args[i]
		if !strings.HasPrefix(a, "-") {
			continue // a subcommand word, resolved above
		}
		name, _, hasValue := strings.Cut(strings.TrimLeft(a, "-"), "=")
		takesValue, ok := spec.Flags[name]
		if !ok {
			t.Errorf("%s: container %s: %s has no flag --%s", w, c.Name, commandName(bin, cmdPath), name)
			continue
		}
		if takesValue && !hasValue {
			i++ // the value is the next argument
		}
	}
	env := r.containerEnv(t, c)
	for _, k := range sortedKeys(env) {
		if !strings.HasPrefix(k, "IDEMD_") && k != "DATABASE_URL" {
			continue
		}
		if !spec.Envs[k] {
			t.Errorf("%s: container %s: %s does not read %s (no flag --%s)", w, c.Name, commandName(bin, cmdPath), k,
				strings.ReplaceAll(strings.ToLower(strings.TrimPrefix(k, "IDEMD_")), "_", "-"))
		}
	}
	checkConfigAccepted(t, w, c, bin, env)
}

func commandName(bin string, cmdPath []string) string {
	return strings.Join(append([]string{filepath.Base(bin)}, cmdPath...), " ")
}

// resolveCommand finds the subcommand path named by the leading positional
// args and returns the help of that (sub)command, which lists its own flags
// and the inherited ones.
func resolveCommand(t *testing.T, bin string, args []string) ([]string, *cliSpec) {
	t.Helper()
	root := helpFor(t, bin, nil)
	var words []string
	for _, a := range args {
		if strings.HasPrefix(a, "-") {
			break
		}
		words = append(words, a)
	}
	if len(root.Commands) == 0 || len(words) == 0 {
		return nil, root
	}
	best := []string(nil)
	for _, c := range root.Commands {
		cw := strings.Fields(c)
		if len(cw) <= len(words) && slices.Equal(cw, words[:len(cw)]) && len(cw) > len(best) {
			best = cw
		}
	}
	if best == nil {
		t.Errorf("%s: args %v name no subcommand of %v", filepath.Base(bin), args, root.Commands)
		return nil, root
	}
	return best, helpFor(t, bin, best)
}

// checkConfigAccepted runs the binary with exactly the container's args and
// environment but a DATABASE_URL that cannot parse. Every idemd command
// validates all its settings first and exits 2 listing every problem; with
// good settings it gets as far as parsing the URL and exits 2 on that alone.
// Either way it stops before touching a database, and any problem other
// than the URL (a bad duration, an unknown enum value) fails the test, as
// does a warning about an IDEMD_ variable the command does not read.
func checkConfigAccepted(t *testing.T, w workload, c *corev1.Container, bin string, env map[string]string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, c.Args...)
	cmd.Env = []string{"DATABASE_URL=postgres://%zz"}
	for _, k := range sortedKeys(env) {
		if k != "DATABASE_URL" && env[k] != "<secret>" && env[k] != "<field>" {
			cmd.Env = append(cmd.Env, k+"="+env[k])
		}
	}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 2 {
		t.Errorf("%s: container %s: with an unparsable DATABASE_URL, want exit 2 before any work, got %v:\n%s", w, c.Name, err, out.String())
		return
	}
	for _, line := range strings.Split(out.String(), "\n") {
		// An IDEMD_ variable the command does not read (a typo, or one
		// meant for another command) is ignored; the command says so.
		if strings.Contains(line, "is not a setting of this command") {
			t.Errorf("%s: container %s: %s does not read a variable of its environment: %s", w, c.Name, filepath.Base(bin), line)
		}
		problem, ok := strings.CutPrefix(strings.TrimSpace(line), "- ")
		if !ok || strings.Contains(problem, "database-url") || strings.Contains(problem, "DATABASE_URL") {
			continue
		}
		// Files the pod mounts (secrets) do not exist on this machine.
		if mentionsMount(problem, c.VolumeMounts) {
			continue
		}
		t.Errorf("%s: container %s: %s rejects its configuration: %s", w, c.Name, filepath.Base(bin), problem)
	}
}

func mentionsMount(s string, mounts []corev1.VolumeMount) bool {
	for _, m := range mounts {
		if strings.Contains(s, m.MountPath) {
			return true
		}
	}
	return false
}
