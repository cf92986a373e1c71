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

// TestChangelogAgreesWithCode: what CHANGELOG.md's release being prepared
// tells an operator to rely on during an upgrade is what the code does:
// each command's oldest schema (its SchemaFloor), the migrations the
// upgrade steps name (they exist, with the column named beside them, and a
// command said to need one has that floor), and every flag and IDEMD_
// variable the steps name (a flag of idemd's commands, by the command's
// parser).
func TestChangelogAgreesWithCode(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(root, "CHANGELOG.md"))
	if err != nil {
		t.Fatal(err)
	}
	text := string(b)
	// The release being prepared: from "## [Unreleased]" to the next
	// release's section.
	start := strings.Index(text, "## [Unreleased]")
	if start < 0 {
		t.Fatal("CHANGELOG.md has no ## [Unreleased] section")
	}
	section := text[start:]
	if end := strings.Index(section[1:], "\n## ["); end >= 0 {
		section = section[:end+1]
	}

	floors := schemaFloors()
	m := regexp.MustCompile(`oldest\s+idemd\s+migration\s+it\s+runs\s+on\s+\(([^)]*)\)`).FindStringSubmatch(section)
	if m == nil {
		t.Fatal("the release's section no longer states each command's oldest schema as \"oldest idemd migration it runs on (the enqueuer N, ...)\": update this test with it")
	}
	stated := map[string]int64{}
	for _, p := range regexp.MustCompile(`(enqueuer|completer|reaper|idemctl)\s+(\d+)`).FindAllStringSubmatch(m[1], -1) {
		n, _ := strconv.ParseInt(p[2], 10, 64)
		stated[p[1]] = n
	}
	for cmd, floor := range floors {
		if got, ok := stated[cmd]; !ok || got != floor {
			t.Errorf("CHANGELOG.md says the %s runs on schema %d or newer (%q); its code's OldestSchema is %d", cmd, got, m[1], floor)
		}
	}

	up := strings.Index(section, "### Upgrading from")
	if up < 0 {
		t.Fatal("the release's section has no \"### Upgrading from\" steps")
	}
	steps := section[up:]

	// Every migration the steps name exists; a column named in backquotes
	// right after it is added by it.
	migrations := map[string]string{}
	files, err := filepath.Glob(filepath.Join(root, "migrations", "000*.sql"))
	if err != nil || len(files) < 10 {
		t.Fatalf("migrations: %v, %d files", err, len(files))
	}
	for _, f := range files {
		sql, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		migrations[filepath.Base(f)[:5]] = string(sql)
	}
	named := regexp.MustCompile(`[Mm]igration\s+(\d{5})(?:\s+\(`+"`"+`([a-z_]+)`+"`"+`\))?`).FindAllStringSubmatch(steps, -1)
	if len(named) == 0 {
		t.Error("the upgrade steps name no migration: the pattern is broken")
	}
	for _, n := range named {
		sql, ok := migrations[n[1]]
		switch {
		case !ok:
			t.Errorf("the upgrade steps name migration %s, which does not exist", n[1])
		case n[2] != "" && !strings.Contains(sql, n[2]):
			t.Errorf("the upgrade steps name migration %s (`%s`), which does not mention %s", n[1], n[2], n[2])
		}
	}
	// "except the completer, which needs migration 00019": that command's
	// floor.
	for _, n := range regexp.MustCompile(`the (enqueuer|completer|reaper|idemctl),\s+which\s+needs\s+migration\s+(\d{5})`).FindAllStringSubmatch(steps, -1) {
		want, _ := strconv.ParseInt(n[2], 10, 64)
		if floors[n[1]] != want {
			t.Errorf("the upgrade steps say the %s needs migration %s; its OldestSchema is %d", n[1], n[2], floors[n[1]])
		}
	}

	flags, envs := map[string]string{}, map[string]string{}
	flagsOf(t, "enqueuer", &enqueuer.Command{}, flags, envs)
	flagsOf(t, "completer", &completer.Command{}, flags, envs)
	flagsOf(t, "reaper", &reaper.Command{}, flags, envs)
	flagsOf(t, "idemctl", &ctl.CLI{}, flags, envs)
	checked := 0
	for _, f := range regexp.MustCompile("`(-{1,2}[a-z][a-z-]*)").FindAllStringSubmatch(steps, -1) {
		name := strings.TrimLeft(f[1], "-")
		if strings.HasPrefix(f[1], "--") && flags[name] == "" || f[1] == "-o" && flags["output"] == "" {
			t.Errorf("the upgrade steps name %s, no flag of idemd's commands", f[1])
		}
		checked++
	}
	for _, e := range regexp.MustCompile(`\bIDEMD_[A-Z_]+\b`).FindAllString(steps, -1) {
		if envs[e] == "" {
			t.Errorf("the upgrade steps name %s, which no command reads", e)
		}
		checked++
	}
	if checked < 3 {
		t.Errorf("found only %d flags and variables in the upgrade steps: the pattern is broken", checked)
	}
}
