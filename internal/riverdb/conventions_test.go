package riverdb

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// riverDriverImport is River's driver interface, exempt from River's
// semver.
const riverDriverImport = "github.com/riverqueue/river/riverdriver"

// riverTable matches one of River's tables (or its job state type) as a
// whole identifier: river_job, not river_job_id.
var riverTable = regexp.MustCompile(`\briver_(job|job_state|migration|queue|leader|client|client_queue)\b`)

// sqlWord says a literal is a statement or a piece of one.
var sqlWord = regexp.MustCompile(`\b(SELECT|INSERT INTO|UPDATE|DELETE FROM|LOCK TABLE|ALTER|FROM|JOIN|WHERE)\b|to_regclass\(`)

// idemdMetadataKey matches the metadata keys idemd puts on River jobs and
// River's insert channel, in any literal.
var idemdMetadataKey = regexp.MustCompile(`\b(idemd_staged_id|idemd_staged_at|river_insert)\b`)

// riverKnowledge lists what a Go file knows of River that only this
// package may: an import of River's driver interface, a SQL literal that
// names a River table, a literal holding a metadata key or River's insert
// channel. Struct tags (JSON field names) and messages for people (an
// error that names river_job for the operator) are not knowledge of the
// schema: a tag is not a literal here, and a message is not SQL.
func riverKnowledge(fset *token.FileSet, file *ast.File) []string {
	var found []string
	tags := map[*ast.BasicLit]bool{}
	ast.Inspect(file, func(n ast.Node) bool {
		if f, ok := n.(*ast.Field); ok && f.Tag != nil {
			tags[f.Tag] = true
		}
		return true
	})
	for _, imp := range file.Imports {
		if p, _ := strconv.Unquote(imp.Path.Value); p == riverDriverImport {
			found = append(found, fset.Position(imp.Pos()).String()+": imports "+riverDriverImport)
		}
	}
	ast.Inspect(file, func(n ast.Node) bool {
		if _, ok := n.(*ast.ImportSpec); ok {
			return false
		}
		lit, ok := n.(*ast.BasicLit)
		if !ok || lit.Kind != token.STRING || tags[lit] {
			return true
		}
		s, err := strconv.Unquote(lit.Value)
		if err != nil {
			return true
		}
		at := fset.Position(lit.Pos()).String()
		if m := idemdMetadataKey.FindString(s); m != "" {
			found = append(found, at+": writes "+m+" (riverdb owns it)")
		}
		if t := riverTable.FindString(s); t != "" && sqlWord.MatchString(s) {
			found = append(found, at+": SQL naming "+t+" (riverdb owns River's schema)")
		}
		return true
	})
	return found
}

// TestRiverKnowledgeIsHere: product code outside this package imports no
// riverdriver and writes no River table name in SQL, no metadata key of
// idemd's on River jobs and not River's insert channel; it asks this
// package. The harness (internal/testing, internal/bench) and tests are
// exempt: they set River's tables up and check what the product wrote with
// SQL of their own, an oracle independent of the code under test. So are
// examples/, which are an API's code (an API that uses River), not idemd's.
func TestRiverKnowledgeIsHere(t *testing.T) {
	root := filepath.Join("..", "..")
	checked := 0
	for _, dir := range []string{"internal", "cmd", "idem"} {
		err := filepath.WalkDir(filepath.Join(root, dir), func(path string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if d.IsDir() && (d.Name() == "testing" || d.Name() == "bench" || d.Name() == "testdata" ||
				path == filepath.Join(root, "internal", "riverdb")) {
				return filepath.SkipDir
			}
			if d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
				return nil
			}
			fset := token.NewFileSet()
			file, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
			if err != nil {
				return err
			}
			checked++
			for _, f := range riverKnowledge(fset, file) {
				t.Error(f)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	if checked < 100 {
		t.Fatalf("checked %d files: the walk did not find the product", checked)
	}
}

// TestRiverKnowledgeFindsIt: the check finds each kind of knowledge in
// code written the ways the product wrote it before this package, and
// passes over what is not knowledge.
func TestRiverKnowledgeFindsIt(t *testing.T) {
	const src = `package p

import "github.com/riverqueue/river/riverdriver"

type T struct {
	Jobs []int ` + "`json:\"river_jobs\"`" + `
}

const q = ` + "`SELECT count(*) FROM river_job WHERE state = 'available'`" + `

var (
	key    = map[string]int64{"idemd_staged_id": 1}
	notify = "pg_notify(current_schema() || '.river_insert', '{}')"
	lock   = "LOCK TABLE river_migration IN SHARE MODE"
	msg    = "a trigger on river_job drops inserts: undo it"
	mine   = "SELECT river_job_id FROM ride_receipts"
)
`
	fset := token.NewFileSet()
	file, err := parser.ParseFile(fset, "p.go", src, 0)
	if err != nil {
		t.Fatal(err)
	}
	got := riverKnowledge(fset, file)
	for _, want := range []string{"imports " + riverDriverImport, "SQL naming river_job", "writes idemd_staged_id", "writes river_insert", "SQL naming river_migration"} {
		if !containsSub(got, want) {
			t.Errorf("not found: %s (found %q)", want, got)
		}
	}
	if len(got) != 5 {
		t.Errorf("found %d, want 5 (the tag, the message and ride_receipts.river_job_id are not River knowledge): %q", len(got), got)
	}
}

func containsSub(list []string, sub string) bool {
	for _, s := range list {
		if strings.Contains(s, sub) {
			return true
		}
	}
	return false
}
