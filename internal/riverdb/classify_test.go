package riverdb

import (
	"go/ast"
	"go/parser"
	"go/token"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver"
	"github.com/riverqueue/river/rivertype"
)

// exportedFields lists t's exported field names.
func exportedFields(t reflect.Type) []string {
	var names []string
	for i := range t.NumField() {
		if f := t.Field(i); f.IsExported() {
			names = append(names, f.Name)
		}
	}
	slices.Sort(names)
	return names
}

// checkClassified fails for a field of typ without a fate in m, and for
// a fate of m that names no field of typ (River renamed or removed it).
func checkClassified(t *testing.T, typ reflect.Type, m map[string]fate) {
	t.Helper()
	fields := exportedFields(typ)
	for _, name := range fields {
		if m[name] == 0 {
			t.Errorf("%s.%s is not classified: a River upgrade added it; decide whether staging applies, copies or refuses it", typ, name)
		}
	}
	for name := range m {
		if !slices.Contains(fields, name) {
			t.Errorf("%s classifies %s, which %s no longer has: a River upgrade removed or renamed it", typ, name, typ)
		}
	}
}

// TestConfigFieldsClassified: every field of river.Config is applied by
// a Stager, refused when set, or one that shapes no insert.
func TestConfigFieldsClassified(t *testing.T) {
	checkClassified(t, reflect.TypeFor[river.Config](), configFate)
	for name, f := range configFate {
		if f == copied {
			t.Errorf("river.Config.%s: a configuration field is applied or refused, not copied", name)
		}
	}
}

// TestJobInsertParamsClassified: every parameter of one insert, as
// River's insert middleware and hooks see it (rivertype.JobInsertParams)
// and as River's driver receives it (riverdriver.JobInsertFastParams, the
// same struct converted), is copied into the staged job, applied before
// the capture, or refused; and Job holds exactly the copied ones.
func TestJobInsertParamsClassified(t *testing.T) {
	checkClassified(t, reflect.TypeFor[rivertype.JobInsertParams](), jobFate)
	checkClassified(t, reflect.TypeFor[riverdriver.JobInsertFastParams](), jobFate)
	if got, want := exportedFields(reflect.TypeFor[Job]()), sortedFates(jobFate, copied); !slices.Equal(got, want) {
		t.Errorf("Job has %v, the copied parameters are %v", got, want)
	}
	for _, name := range sortedFates(jobFate, refused) {
		if jobRefusal[name] == "" {
			t.Errorf("%s is refused without a reason", name)
		}
	}
	for _, name := range sortedFates(jobFate, notInsert) {
		t.Errorf("%s: an insert's parameter shapes the insert", name)
	}
}

// driverFate classifies the methods of River's driver and executor that
// an insert reaches, with the ones Driver overrides.
var driverFate = map[string]fate{
	// Driver: River's InsertTx, InsertManyTx and InsertManyFastTx reach
	// the executor of the caller's transaction through it.
	"UnwrapExecutor": applied,
	// Executor: the final write of InsertTx and InsertManyTx, and of
	// InsertManyFastTx (COPY): captured, or given the staged unique key.
	"JobInsertFastMany":            applied,
	"JobInsertFastManyNoReturning": applied,
	// Executor: River's client never inserts through these (they are
	// rivertest's fixtures'); idemd does not override them.
	"JobInsertFull":     notInsert,
	"JobInsertFullMany": notInsert,
}

// TestDriverOverrides: each method Driver and its executor declare
// overrides a method of River's driver interface with the same signature
// (a rename in River would leave it dead, and River's own write would
// run), every insert method of River's executor interface is classified,
// and the overrides are exactly the methods classified applied.
func TestDriverOverrides(t *testing.T) {
	declared := declaredMethods(t, "driver.go")
	ifaces := map[string]reflect.Type{
		"Driver":   reflect.TypeFor[riverdriver.Driver[any]](),
		"executor": reflect.TypeFor[riverdriver.ExecutorTx](),
	}
	impls := map[string]reflect.Type{"Driver": reflect.TypeFor[Driver](), "executor": reflect.TypeFor[executor]()}
	var overridden []string
	for recv, methods := range declared {
		iface := ifaces[recv]
		if iface == nil {
			continue
		}
		for _, name := range methods {
			want, ok := iface.MethodByName(name)
			if !ok {
				t.Errorf("%s.%s overrides nothing: River's %s has no such method", recv, name, iface)
				continue
			}
			got, _ := impls[recv].MethodByName(name)
			if recv == "Driver" {
				// Driver[any]'s signature names any where ours names pgx.Tx.
				if got.Type.NumIn()-1 != want.Type.NumIn() || got.Type.NumOut() != want.Type.NumOut() {
					t.Errorf("%s.%s: signature %s, River's %s", recv, name, got.Type, want.Type)
				}
			} else if !sameSignature(got.Type, want.Type) {
				t.Errorf("%s.%s: signature %s, River's %s", recv, name, got.Type, want.Type)
			}
			overridden = append(overridden, name)
		}
	}
	slices.Sort(overridden)
	if want := sortedFates(driverFate, applied); !slices.Equal(overridden, want) {
		t.Errorf("Driver overrides %v; classified as overridden: %v", overridden, want)
	}
	exec := reflect.TypeFor[riverdriver.ExecutorTx]()
	for i := range exec.NumMethod() {
		if name := exec.Method(i).Name; strings.HasPrefix(name, "JobInsert") && driverFate[name] == 0 {
			t.Errorf("riverdriver.ExecutorTx.%s is not classified: a River upgrade added an insert method; "+
				"decide whether River's client reaches it and Driver must override it", name)
		}
	}
	for name := range driverFate {
		if _, onExec := exec.MethodByName(name); !onExec && name != "UnwrapExecutor" {
			t.Errorf("driverFate names %s, which River's executor no longer has", name)
		}
	}
}

// sameSignature compares a method value's type (receiver bound) with an
// interface method's.
func sameSignature(got, want reflect.Type) bool {
	if got.NumIn()-1 != want.NumIn() || got.NumOut() != want.NumOut() {
		return false
	}
	for i := range want.NumIn() {
		if got.In(i+1) != want.In(i) {
			return false
		}
	}
	for i := range want.NumOut() {
		if got.Out(i) != want.Out(i) {
			return false
		}
	}
	return true
}

// declaredMethods lists the methods file declares, by receiver type name.
func declaredMethods(t *testing.T, file string) map[string][]string {
	t.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), file, nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]string{}
	for _, d := range f.Decls {
		fn, ok := d.(*ast.FuncDecl)
		if !ok || fn.Recv == nil || !fn.Name.IsExported() {
			continue
		}
		typ := fn.Recv.List[0].Type
		if star, ok := typ.(*ast.StarExpr); ok {
			typ = star.X
		}
		if id, ok := typ.(*ast.Ident); ok {
			out[id.Name] = append(out[id.Name], fn.Name.Name)
		}
	}
	return out
}

// StagingConfig applies what it classifies applied, leaves out what
// shapes no insert, and refuses what staging cannot honour, by name.
func TestStagingConfig(t *testing.T) {
	mw := []rivertype.Middleware{}
	cfg, err := StagingConfig(&river.Config{MaxAttempts: 7, SkipUnknownJobCheck: true, Middleware: mw,
		Queues: map[string]river.QueueConfig{"default": {MaxWorkers: 1}}, ID: "api-1"})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.MaxAttempts != 7 || !cfg.SkipUnknownJobCheck || cfg.Middleware == nil {
		t.Errorf("applied fields not applied: %+v", cfg)
	}
	if cfg.Queues != nil || cfg.ID != "" {
		t.Errorf("fields that shape no insert kept: Queues %v, ID %q", cfg.Queues, cfg.ID)
	}
	if _, err := StagingConfig(&river.Config{Schema: "jobs"}); err == nil || !strings.Contains(err.Error(), "Schema") {
		t.Errorf("Schema set: %v, want a refusal naming it", err)
	}
	if cfg, err := StagingConfig(nil); err != nil || cfg == nil {
		t.Errorf("nil: %v, %v", cfg, err)
	}
}
