package config

import (
	"fmt"
	"reflect"
	"strconv"
	"strings"
	"time"

	"github.com/alecthomas/kong"
)

// Defaulter is implemented by a command whose flags are a service's
// Settings: FlagDefaults returns the service's defaults (its
// DefaultSettings), and the Settings fields' tags read them as
// default:"${flag_name}" (the flag's name with - turned into _). The service
// package is then the one place a default is written; --help shows it.
type Defaulter interface {
	FlagDefaults() any
}

// Vars turns a struct of defaults into kong variables, one per field that
// has a name tag, keyed by the flag's name with - turned into _. It walks
// the structs kong flattens into flags, as kong does: anonymous embedded
// structs, and named struct fields tagged embed:"" (another package's
// Settings beside the command's own), each with its prefix:"..." tag put
// before the names of the flags inside it. A defaults struct with several
// packages' settings has the command's embedding, e.g. the completer's:
//
//	struct {
//		Settings `embed:""`
//		Stats    dbstats.Settings `embed:""`
//	}{DefaultSettings(), dbstats.DefaultSettings()}
//
// Two fields giving the same variable are an error: one would silently
// take the other's default.
func Vars(defaults any) (kong.Vars, error) {
	v := reflect.ValueOf(defaults)
	for v.Kind() == reflect.Pointer {
		v = v.Elem()
	}
	if v.Kind() != reflect.Struct {
		return nil, fmt.Errorf("config: defaults: %T is not a struct", defaults)
	}
	vars := kong.Vars{}
	if err := addVars(vars, v, ""); err != nil {
		return nil, err
	}
	return vars, nil
}

func addVars(vars kong.Vars, v reflect.Value, prefix string) error {
	t := v.Type()
	for i := range t.NumField() {
		f, fv := t.Field(i), v.Field(i)
		// An embedded struct of an unexported type still has its
		// exported fields promoted, as kong reads them.
		if !f.IsExported() && !f.Anonymous {
			continue
		}
		_, embed := f.Tag.Lookup("embed")
		if f.Anonymous || embed {
			for fv.Kind() == reflect.Pointer && !fv.IsNil() {
				fv = fv.Elem()
			}
			if fv.Kind() == reflect.Struct && f.Tag.Get("name") == "" {
				if err := addVars(vars, fv, prefix+f.Tag.Get("prefix")); err != nil {
					return err
				}
				continue
			}
		}
		name := f.Tag.Get("name")
		if name == "" {
			continue
		}
		name = prefix + name
		s, err := formatDefault(fv, f.Tag.Get("sep"))
		if err != nil {
			return fmt.Errorf("config: default of --%s: %w", name, err)
		}
		key := strings.ReplaceAll(name, "-", "_")
		if _, dup := vars[key]; dup {
			return fmt.Errorf("config: defaults: two fields give the default of --%s", name)
		}
		vars[key] = s
	}
	return nil
}

// formatDefault writes a value the way a user would type the flag.
func formatDefault(v reflect.Value, sep string) (string, error) {
	if d, ok := v.Interface().(time.Duration); ok {
		return FormatDuration(d), nil
	}
	switch v.Kind() {
	case reflect.String:
		return v.String(), nil
	case reflect.Bool:
		return strconv.FormatBool(v.Bool()), nil
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return strconv.FormatInt(v.Int(), 10), nil
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return strconv.FormatUint(v.Uint(), 10), nil
	case reflect.Float32, reflect.Float64:
		return strconv.FormatFloat(v.Float(), 'g', -1, 64), nil
	case reflect.Slice:
		if sep == "" {
			sep = ","
		}
		parts := make([]string, v.Len())
		for i := range v.Len() {
			s, err := formatDefault(v.Index(i), "")
			if err != nil {
				return "", err
			}
			parts[i] = s
		}
		return strings.Join(parts, sep), nil
	}
	return "", fmt.Errorf("unsupported type %s", v.Type())
}

// FormatDuration writes d as an operator would: 72h, 1m30s, 10ms — without
// time.Duration's trailing zero units (72h0m0s).
func FormatDuration(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = s[:len(s)-2]
	}
	if strings.HasSuffix(s, "h0m") {
		s = s[:len(s)-2]
	}
	return s
}
