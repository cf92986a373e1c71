package api_test

import (
	"net/url"
	"strconv"
	"testing"

	"github.com/idemd/idemd/examples/rocketrides/api"
	"github.com/idemd/idemd/idem"
)

// FuzzRideParamsReplayRoundTrip is the completer's contract: whatever body a
// client sends (form or JSON), if it is accepted, then the params stored on
// the key (canonical JSON), sent back as a JSON body, parse to the same
// params and the same fingerprint.
func FuzzRideParamsReplayRoundTrip(f *testing.F) {
	f.Add(true, "origin_lat=0.0&origin_lon=0.0&target_lat=37.7749&target_lon=-122.4194")
	f.Add(true, "origin_lat=-0&origin_lon=1e2&target_lat=0x1p-2&target_lon=180")
	f.Add(false, `{"origin_lat":"1.5","origin_lon":2,"target_lat":-90,"target_lon":1e-300}`)
	f.Add(false, `{"origin_lat":89.99999999999999,"origin_lon":-179.9,"target_lat":0.1,"target_lon":0.30000000000000004,"x":[1]}`)
	f.Add(false, `{"origin_lat":null}`)
	f.Fuzz(func(t *testing.T, form bool, body string) {
		ct := "application/json"
		if form {
			ct = "application/x-www-form-urlencoded"
		}
		p, err := api.ParseRideParams(ct, []byte(body))
		if err != nil {
			return
		}
		stored, err := idem.CanonicalParams(p)
		if err != nil {
			t.Fatalf("canonical: %v", err)
		}
		p2, err := api.ParseRideParams("application/json", stored)
		if err != nil {
			t.Fatalf("stored params %s do not parse: %v", stored, err)
		}
		if p2 != p {
			t.Fatalf("replay parses %+v, original %+v", p2, p)
		}
		again, _ := idem.CanonicalParams(p2)
		if idem.Fingerprint("POST", "/rides", stored) != idem.Fingerprint("POST", "/rides", again) {
			t.Fatal("fingerprint changed through a replay")
		}
		// And the same values as a form give the same params.
		v := url.Values{}
		for k, x := range map[string]float64{"origin_lat": p.OriginLat, "origin_lon": p.OriginLon, "target_lat": p.TargetLat, "target_lon": p.TargetLon} {
			v.Set(k, formatFloat(x))
		}
		p3, err := api.ParseRideParams("", []byte(v.Encode()))
		if err != nil || p3 != p {
			t.Fatalf("form of %+v parses to %+v (%v)", p, p3, err)
		}
	})
}

func formatFloat(f float64) string { return strconv.FormatFloat(f, 'g', -1, 64) }
