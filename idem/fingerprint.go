package idem

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"
)

// FingerprintVersion prefixes what Fingerprint hashes, so the scheme can
// change without old fingerprints silently matching new ones.
const FingerprintVersion = "idemd-fp-v1"

// CanonicalParams returns the canonical JSON of params: objects with sorted
// keys, no insignificant whitespace, no HTML escaping, and numbers in one
// spelling (integers that fit int64 in decimal, every other number as the
// shortest float64 form). The same logical parameters therefore give the same
// bytes whether they came from a form, from a JSON body, or back out of a
// PostgreSQL JSONB column (which re-spells numbers and reorders keys).
func CanonicalParams(params any) ([]byte, error) {
	raw, ok := params.(json.RawMessage)
	if !ok {
		b, err := json.Marshal(params)
		if err != nil {
			return nil, fmt.Errorf("idem: canonical params: encode: %w", err)
		}
		raw = b
	}
	return CanonicalJSON(raw)
}

// CanonicalJSON is CanonicalParams for an already encoded JSON document.
func CanonicalJSON(doc []byte) ([]byte, error) {
	dec := json.NewDecoder(bytes.NewReader(doc))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, fmt.Errorf("idem: canonical params: decode: %w", err)
	}
	if dec.More() {
		return nil, fmt.Errorf("idem: canonical params: trailing data after JSON value")
	}
	var b bytes.Buffer
	if err := writeCanonical(&b, v); err != nil {
		return nil, fmt.Errorf("idem: canonical params: %w", err)
	}
	return b.Bytes(), nil
}

func writeCanonical(b *bytes.Buffer, v any) error {
	switch v := v.(type) {
	case nil:
		b.WriteString("null")
	case bool:
		b.WriteString(strconv.FormatBool(v))
	case json.Number:
		s, err := canonicalNumber(string(v))
		if err != nil {
			return err
		}
		b.WriteString(s)
	case string:
		writeString(b, v)
	case []any:
		b.WriteByte('[')
		for i, e := range v {
			if i > 0 {
				b.WriteByte(',')
			}
			if err := writeCanonical(b, e); err != nil {
				return err
			}
		}
		b.WriteByte(']')
	case map[string]any:
		keys := make([]string, 0, len(v))
		for k := range v {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		b.WriteByte('{')
		for i, k := range keys {
			if i > 0 {
				b.WriteByte(',')
			}
			writeString(b, k)
			b.WriteByte(':')
			if err := writeCanonical(b, v[k]); err != nil {
				return err
			}
		}
		b.WriteByte('}')
	default:
		return fmt.Errorf("unexpected JSON value %T", v)
	}
	return nil
}

func writeString(b *bytes.Buffer, s string) {
	// Go's encoder with HTML escaping off; invalid UTF-8 becomes U+FFFD,
	// which is also all PostgreSQL JSONB could have stored.
	var sb strings.Builder
	enc := json.NewEncoder(&sb)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(s) // a string always encodes
	b.WriteString(strings.TrimSuffix(sb.String(), "\n"))
}

func canonicalNumber(lit string) (string, error) {
	if i, err := strconv.ParseInt(lit, 10, 64); err == nil {
		return strconv.FormatInt(i, 10), nil
	}
	f, err := strconv.ParseFloat(lit, 64)
	if err != nil && !isRangeErr(err) {
		return "", fmt.Errorf("number %q: %w", lit, err)
	}
	if math.IsInf(f, 0) || math.IsNaN(f) {
		return "", fmt.Errorf("number %q out of float64 range", lit)
	}
	if f == math.Trunc(f) && math.Abs(f) < 1<<53 {
		// 1.0, 1e2 and 100 are one number; write the integer spelling.
		return strconv.FormatInt(int64(f), 10), nil
	}
	return strconv.FormatFloat(f, 'g', -1, 64), nil
}

func isRangeErr(err error) bool {
	ne, ok := err.(*strconv.NumError)
	return ok && ne.Err == strconv.ErrRange
}

// Fingerprint is the request fingerprint stored on the key: the hex SHA-256
// of the version, the upper-cased method, the path and the canonical params,
// newline-separated. A reused key must match it exactly.
func Fingerprint(method, path string, canonicalParams []byte) string {
	h := sha256.New()
	h.Write([]byte(FingerprintVersion))
	h.Write([]byte{'\n'})
	h.Write([]byte(strings.ToUpper(method)))
	h.Write([]byte{'\n'})
	h.Write([]byte(path))
	h.Write([]byte{'\n'})
	h.Write(canonicalParams)
	return hex.EncodeToString(h.Sum(nil))
}
