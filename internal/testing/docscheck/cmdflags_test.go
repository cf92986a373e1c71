package docscheck

import (
	"regexp"
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

// commandModel is cli's model as the binary's parser builds it
// (config.Model, config.Parse's own options).
func commandModel(t *testing.T, name string, cli any) *kong.Application {
	t.Helper()
	app, err := config.Model(name, cli)
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return app
}

// invocation finds a command of idemd's run in a snippet: its name at the
// start, after a space or a path's slash (/usr/local/bin/reaper, ./cmd/reaper)
// or kubectl's "--", and the words after it up to a pipe, a redirect, a
// comment or the next command of a shell line.
var invocation = regexp.MustCompile(`(?:^|[\s/(])(enqueuer|completer|reaper|idemctl)((?:\s+[^\s|;&>#]+)*)`)

// flagName is a flag's name as idemd's commands spell them.
var flagName = regexp.MustCompile(`^[a-z][a-z0-9-]*$`)

// inlineCode is a backquoted span of a page's prose.
var inlineCode = regexp.MustCompile("`([^`\n]+)`")

// snippets are a page's code: each backquoted span, and each line of its
// fenced blocks, with a line ending in a backslash joined to the next.
func snippets(text string) []string {
	var out []string
	inFence := false
	var pending string
	for _, line := range strings.Split(text, "\n") {
		trimmed := strings.TrimSpace(line)
		if strings.HasPrefix(trimmed, "```") {
			inFence = !inFence
			pending = ""
			continue
		}
		if inFence {
			if cont, ok := strings.CutSuffix(trimmed, "\\"); ok {
				pending += cont + " "
				continue
			}
			out = append(out, pending+trimmed)
			pending = ""
			continue
		}
		for _, m := range inlineCode.FindAllStringSubmatch(line, -1) {
			out = append(out, m[1])
		}
	}
	return out
}

// TestDocFlagsBelongToTheirCommand: every --flag a page gives to one of
// idemd's commands in code (`reaper --dry-run`, `idemctl migrate
// --print-sql`, a shell line in a fenced block) is a flag that command, or
// the subcommand named before it, really has: the binaries' own parsers are
// the oracle. TestDocReferencesExist checks that a flag exists somewhere;
// this, that it is where the page says.
func TestDocFlagsBelongToTheirCommand(t *testing.T) {
	models := map[string]*kong.Application{
		"enqueuer":  commandModel(t, "enqueuer", &enqueuer.Command{}),
		"completer": commandModel(t, "completer", &completer.Command{}),
		"reaper":    commandModel(t, "reaper", &reaper.Command{}),
		"idemctl":   commandModel(t, "idemctl", &ctl.CLI{}),
	}
	checked := 0
	for _, p := range docPages(t) {
		for _, snip := range snippets(p.text) {
			for _, m := range invocation.FindAllStringSubmatch(snip, -1) {
				node := models[m[1]].Node
				path := m[1]
				for _, word := range strings.Fields(m[2]) {
					word = strings.Trim(word, `"',)`)
					if !strings.HasPrefix(word, "--") || word == "--" {
						// A subcommand descends; anything else is an
						// argument or a flag's value.
						for _, c := range node.Children {
							if c.Name == word || slices.Contains(c.Aliases, word) {
								node, path = c, path+" "+word
								break
							}
						}
						continue
					}
					name, _, _ := strings.Cut(strings.TrimPrefix(word, "--"), "=")
					if !flagName.MatchString(name) {
						continue // a placeholder (--<flag>), not a flag
					}
					checked++
					if !hasFlag(node, name) {
						t.Errorf("%s: `%s` gives --%s, which %s does not have (in %q)", p.path, path, name, path, snip)
					}
				}
			}
		}
	}
	if checked < 50 {
		t.Errorf("checked only %d flags given to idemd's commands in the docs: the snippet or invocation pattern is broken", checked)
	}
}

// hasFlag says whether node or a command above it (whose flags kong
// accepts after a subcommand too) has the flag name, or --no-name for a
// negatable one, or the built-in --help and --version.
func hasFlag(node *kong.Node, name string) bool {
	if name == "help" || name == "version" {
		return true
	}
	for _, group := range node.AllFlags(false) {
		for _, f := range group {
			if f.Name == name || f.Tag != nil && f.Tag.Negatable != "" && name == "no-"+f.Name {
				return true
			}
		}
	}
	return false
}
