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
// has a name tag (embedded structs included), keyed by the flag's name with
// - turned into _.
func Vars(defaults any) (kong.Vars, error) {
	v := reflect.ValueOf(defaults)
	for v.Kind() == reflect.Pointer {
		v = v.Elem()
	}
	if v.Kind() != reflect.Struct {
		return nil, fmt.Errorf("config: defaults: %T is not a struct", defaults)
	}
	vars := kong.Vars{}
	if err := addVars(vars, v); err != nil {
		return nil, err
	}
	return vars, nil
}

func addVars(vars kong.Vars, v reflect.Value) error {
	t := v.Type()
	for i := range t.NumField() {
		f, fv := t.Field(i), v.Field(i)
		if !f.IsExported() {
			continue
		}
		name := f.Tag.Get("name")
		if name == "" {
			if f.Anonymous && fv.Kind() == reflect.Struct {
				if err := addVars(vars, fv); err != nil {
					return err
				}
			}
			continue
		}
		s, err := formatDefault(fv, f.Tag.Get("sep"))
		if err != nil {
			return fmt.Errorf("config: default of --%s: %w", name, err)
		}
		vars[strings.ReplaceAll(name, "-", "_")] = s
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
