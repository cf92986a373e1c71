package config

import (
	"fmt"
	"slices"
	"strings"

	"github.com/alecthomas/kong"
)

// A mistyped variable (IDEMD_RATEE=5) is read by nothing: the command runs
// at the flag's default and nobody learns why. Each command therefore
// names, once at start, every IDEMD_* variable of its environment that
// none of its flags reads, with the known one nearest to it.

// UnknownVar is an IDEMD_* environment variable no flag of the command
// reads.
type UnknownVar struct {
	Name    string // the variable as set
	Nearest string // the known variable nearest to it by edit distance
}

func (u UnknownVar) String() string {
	return fmt.Sprintf("the environment variable %s is not a setting of this command and is ignored; did you mean %s?", u.Name, u.Nearest)
}

// KnownEnv lists the environment variables app's flags read, in every
// command of it (an idemctl variable meant for another subcommand is not a
// mistake), sorted.
func KnownEnv(app *kong.Application) []string {
	var known []string
	var walk func(n *kong.Node)
	walk = func(n *kong.Node) {
		for _, f := range n.Flags {
			for _, env := range f.Tag.Envs {
				if env != "" && env != "-" && !slices.Contains(known, env) {
					known = append(known, env)
				}
			}
		}
		for _, c := range n.Children {
			walk(c)
		}
	}
	walk(app.Node)
	slices.Sort(known)
	return known
}

// UnknownEnv returns the IDEMD_* variables of environ ("NAME=value"
// entries, as os.Environ gives them) that are not in known, each with the
// nearest of known, in environ's order.
func UnknownEnv(known, environ []string) []UnknownVar {
	var unknown []UnknownVar
	for _, kv := range environ {
		name, _, _ := strings.Cut(kv, "=")
		if !strings.HasPrefix(name, EnvPrefix+"_") || slices.Contains(known, name) {
			continue
		}
		unknown = append(unknown, UnknownVar{Name: name, Nearest: nearest(name, known)})
	}
	return unknown
}

// nearest is the entry of known at the least edit distance from name, the
// first in known's order among equals; "" when known is empty.
func nearest(name string, known []string) string {
	best, bestDist := "", -1
	for _, k := range known {
		if d := editDistance(name, k); bestDist < 0 || d < bestDist {
			best, bestDist = k, d
		}
	}
	return best
}

// editDistance is the Levenshtein distance between a and b: the fewest
// insertions, deletions and substitutions of one byte that turn a into b.
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}
