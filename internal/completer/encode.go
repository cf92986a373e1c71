package completer

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/url"
	"sort"
	"strconv"
	"strings"
)

// encodeBody turns the stored request_params (JSON text) into the replayed
// body and its Content-Type. JSON is sent as stored, byte for byte.
func encodeBody(enc Encoding, params []byte) ([]byte, string, error) {
	switch enc {
	case EncodingForm:
		b, err := formEncode(params)
		return b, contentType(enc), err
	default:
		return params, contentType(enc), nil
	}
}

// contentType is the Content-Type of bodies in encoding enc.
func contentType(enc Encoding) string {
	if enc == EncodingForm {
		return "application/x-www-form-urlencoded"
	}
	return "application/json"
}

// formEncode encodes a JSON object the way Stripe's clients do: nested
// objects as a[b]=c, arrays as a[0]=x, null omitted, numbers as written,
// keys sorted so the body (and its signature) is deterministic.
func formEncode(params []byte) ([]byte, error) {
	dec := json.NewDecoder(bytes.NewReader(params))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, fmt.Errorf("request_params is not valid JSON: %w", err)
	}
	obj, ok := v.(map[string]any)
	if !ok {
		if v == nil {
			return nil, nil
		}
		return nil, fmt.Errorf("request_params is a JSON %T, form encoding needs an object", v)
	}
	var pairs []string
	var walk func(prefix string, v any)
	walk = func(prefix string, v any) {
		switch x := v.(type) {
		case nil:
		case map[string]any:
			keys := make([]string, 0, len(x))
			for k := range x {
				keys = append(keys, k)
			}
			sort.Strings(keys)
			for _, k := range keys {
				walk(prefix+"["+k+"]", x[k])
			}
		case []any:
			for i, e := range x {
				walk(prefix+"["+strconv.Itoa(i)+"]", e)
			}
		case json.Number:
			pairs = append(pairs, url.QueryEscape(prefix)+"="+url.QueryEscape(x.String()))
		case bool:
			pairs = append(pairs, url.QueryEscape(prefix)+"="+strconv.FormatBool(x))
		case string:
			pairs = append(pairs, url.QueryEscape(prefix)+"="+url.QueryEscape(x))
		}
	}
	keys := make([]string, 0, len(obj))
	for k := range obj {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		walk(k, obj[k])
	}
	return []byte(strings.Join(pairs, "&")), nil
}

// EncodeBody is the body and Content-Type the completer replays stored
// params with: what idemctl conformance sends on its signed replays, so
// they are byte for byte the completer's.
func EncodeBody(enc Encoding, params []byte) ([]byte, string, error) {
	return encodeBody(enc, params)
}
