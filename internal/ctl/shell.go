package ctl

import (
	"fmt"
	"slices"
	"strings"

	"github.com/alecthomas/kong"

	"github.com/idemd/idemd/internal/buildinfo"
)

// The commands below need no database (CLI.Check): they read only the
// command model and the binary.

// HelpCmd is `idemctl help [COMMAND...]`, the same as `idemctl [COMMAND...]
// --help`.
type HelpCmd struct {
	Command  []string `arg:"" optional:"" help:"The command to describe (idemctl help keys retry)."`
	selected bool
}

// BeforeApply is kong's hook, called when the command is on the command line.
func (c *HelpCmd) BeforeApply() error { c.selected = true; return nil }

// Run prints the help by parsing the command with --help, so it is the
// very text --help prints; an unknown command is reported by that parse.
func (c *HelpCmd) Run(g *Globals) error {
	if code := Main(append(slices.Clone(c.Command), "--help"), g.Stdout, g.Stderr); code != 0 {
		return exitStatus(code)
	}
	return nil
}

// VersionCmd is `idemctl version`, the same as `idemctl --version`.
type VersionCmd struct {
	selected bool
}

// BeforeApply is kong's hook, called when the command is on the command line.
func (c *VersionCmd) BeforeApply() error { c.selected = true; return nil }

// Run prints the version line --version prints.
func (c *VersionCmd) Run(g *Globals) error {
	_, err := fmt.Fprintln(g.Stdout, buildinfo.Line("idemctl"))
	return err
}

// exitStatus is a command's exit code whose cause has been printed
// already (help's inner parse): Main exits with it and prints nothing.
type exitStatus int

func (e exitStatus) Error() string { return fmt.Sprintf("exit status %d", int(e)) }

// CompletionCmd prints a shell's completion script.
type CompletionCmd struct {
	Shell string `arg:"" enum:"bash,zsh,fish" help:"The shell: bash, zsh or fish."`
	// selected: idemctl then runs without a database (CLI.Check).
	selected bool
}

// BeforeApply is kong's hook, called when the command is on the command line.
func (c *CompletionCmd) BeforeApply() error { c.selected = true; return nil }

// Help implements kong.HelpProvider.
func (c *CompletionCmd) Help() string {
	return `Each script asks idemctl itself what may follow the words typed so far
(the hidden command __complete), so it completes the commands and flags of
the idemctl on the PATH, whatever its version.

Examples:
  source <(idemctl completion bash)        in ~/.bashrc
  idemctl completion zsh > "${fpath[1]}/_idemctl"
  idemctl completion fish > ~/.config/fish/completions/idemctl.fish`
}

// completionScripts are the per-shell wrappers around __complete.
var completionScripts = map[string]string{
	"bash": `# bash completion for idemctl (idemctl completion bash)
_idemctl() {
    local IFS=$'\n'
    COMPREPLY=($(idemctl __complete -- "${COMP_WORDS[@]:1:COMP_CWORD}" 2>/dev/null))
}
complete -o default -F _idemctl idemctl
`,
	"zsh": `#compdef idemctl
# zsh completion for idemctl (idemctl completion zsh)
_idemctl() {
    local -a candidates
    candidates=("${(@f)$(idemctl __complete -- "${(@)words[2,CURRENT]}" 2>/dev/null)}")
    compadd -a candidates
}
compdef _idemctl idemctl
`,
	"fish": `# fish completion for idemctl (idemctl completion fish)
complete -c idemctl -f -a '(idemctl __complete -- (commandline -opc)[2..-1] (commandline -ct) 2>/dev/null)'
`,
}

// Run prints the script.
func (c *CompletionCmd) Run(g *Globals) error {
	_, err := fmt.Fprint(g.Stdout, completionScripts[c.Shell])
	return err
}

// CompleteCmd is what the completion scripts call: the candidates for the
// last of Words (possibly empty, the word being typed) after the others.
type CompleteCmd struct {
	Words    []string `arg:"" optional:"" passthrough:"" help:"The words typed after idemctl, the last one partial."`
	selected bool
}

// BeforeApply is kong's hook, called when the command is on the command line.
func (c *CompleteCmd) BeforeApply() error { c.selected = true; return nil }

// Run prints one candidate a line.
func (c *CompleteCmd) Run(kctx *kong.Context, g *Globals) error {
	words := c.Words
	if len(words) > 0 && words[0] == "--" {
		words = words[1:]
	}
	for _, cand := range complete(kctx.Model.Node, words) {
		fmt.Fprintln(g.Stdout, cand)
	}
	return nil
}

// complete returns the candidates for the last word after the others,
// walking the command model: a word naming a child command descends into
// it, a flag that takes a value skips the word after it.
func complete(root *kong.Node, words []string) []string {
	partial := ""
	if len(words) > 0 {
		partial, words = words[len(words)-1], words[:len(words)-1]
	}
	node := root
	flags := func() []*kong.Flag {
		var out []*kong.Flag
		for _, group := range node.AllFlags(true) {
			out = append(out, group...)
		}
		return out
	}
	for i := 0; i < len(words); i++ {
		w := words[i]
		if strings.HasPrefix(w, "-") {
			name, _, hasValue := strings.Cut(strings.TrimLeft(w, "-"), "=")
			for _, f := range flags() {
				if f.Name == name && !f.IsBool() && !f.IsCounter() && !hasValue {
					i++ // its value
				}
			}
			continue
		}
		for _, child := range node.Children {
			if child.Name == w || slices.Contains(child.Aliases, w) {
				node = child
				break
			}
		}
	}
	var out []string
	if strings.HasPrefix(partial, "-") {
		for _, f := range flags() {
			if !f.Hidden && strings.HasPrefix("--"+f.Name, partial) {
				out = append(out, "--"+f.Name)
			}
		}
		return out
	}
	for _, child := range node.Children {
		if !child.Hidden && strings.HasPrefix(child.Name, partial) {
			out = append(out, child.Name)
		}
	}
	return out
}
