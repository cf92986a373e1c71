package api

import (
	"bytes"
	"encoding/json"
	"fmt"
	"mime"
	"net/url"
	"strconv"
)

// RideParams are POST /rides' parameters, validated. They are what the
// idempotency key stores and fingerprints (canonical JSON), so a replay of
// the stored params as a JSON body parses back to the same values.
type RideParams struct {
	OriginLat float64 `json:"origin_lat"`
	OriginLon float64 `json:"origin_lon"`
	TargetLat float64 `json:"target_lat"`
	TargetLon float64 `json:"target_lon"`
}

// ParamError is a client error in the parameters.
type ParamError struct {
	Status int // 400 for an unreadable body, 422 for a bad parameter
	Msg    string
}

func (e *ParamError) Error() string { return e.Msg }

// ParseRideParams reads the parameters from a JSON object body
// (Content-Type: application/json; values may be numbers or numeric strings)
// or a form body (application/x-www-form-urlencoded, the article's
// encoding). Both give the same RideParams for the same values.
func ParseRideParams(contentType string, body []byte) (RideParams, error) {
	mt, _, _ := mime.ParseMediaType(contentType)
	var get func(name string) (string, bool, error)
	if mt == "application/json" {
		dec := json.NewDecoder(bytes.NewReader(body))
		dec.UseNumber()
		var obj map[string]any
		if err := dec.Decode(&obj); err != nil || obj == nil || dec.More() {
			return RideParams{}, &ParamError{Status: 400, Msg: "Request body must be a JSON object."}
		}
		get = func(name string) (string, bool, error) {
			switch v := obj[name].(type) {
			case nil:
				return "", false, nil
			case json.Number:
				return string(v), true, nil
			case string:
				return v, v != "", nil
			default:
				return "", true, fmt.Errorf("not a number")
			}
		}
	} else {
		form, err := url.ParseQuery(string(body))
		if err != nil {
			return RideParams{}, &ParamError{Status: 400, Msg: "Request body must be form-encoded or a JSON object."}
		}
		get = func(name string) (string, bool, error) {
			v := form.Get(name)
			return v, v != "", nil
		}
	}
	var p RideParams
	for _, f := range []struct {
		name  string
		dst   *float64
		limit float64
		kind  string
	}{
		{"origin_lat", &p.OriginLat, 90, "latitude"},
		{"origin_lon", &p.OriginLon, 180, "longitude"},
		{"target_lat", &p.TargetLat, 90, "latitude"},
		{"target_lon", &p.TargetLon, 180, "longitude"},
	} {
		raw, present, err := get(f.name)
		if err == nil && !present {
			return RideParams{}, &ParamError{Status: 422, Msg: fmt.Sprintf("Please specify parameter '%s'.", f.name)}
		}
		var v float64
		if err == nil {
			v, err = strconv.ParseFloat(raw, 64)
		}
		if err != nil {
			return RideParams{}, &ParamError{Status: 422, Msg: fmt.Sprintf("Parameter '%s' must be a floating-point number.", f.name)}
		}
		// Written so NaN fails too.
		if !(v >= -f.limit && v <= f.limit) {
			return RideParams{}, &ParamError{Status: 422, Msg: fmt.Sprintf("Parameter '%s' must be a valid %s coordinate.", f.name, f.kind)}
		}
		if v == 0 {
			v = 0 // -0 and 0 are one coordinate (and one fingerprint)
		}
		*f.dst = v
	}
	return p, nil
}
