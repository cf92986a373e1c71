package operator

import (
	"testing"
	"time"
)

// TestAge: the one way ages are written, in idemctl's tables and on the
// console's pages: days and hours, hours and minutes, or Go's duration
// below an hour, rounded to the second.
func TestAge(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		d    time.Duration
		want string
	}{
		{0, "0s"},
		{40*time.Second + 400*time.Millisecond, "40s"},
		{59*time.Minute + 59*time.Second, "59m59s"},
		{time.Hour, "1h0m"},
		{5*time.Hour + 12*time.Minute + 30*time.Second, "5h12m"},
		{24 * time.Hour, "1d0h"},
		{76*time.Hour + 59*time.Minute, "3d4h"},
	} {
		if got := Age(tc.d); got != tc.want {
			t.Errorf("Age(%s) = %q, want %q", tc.d, got, tc.want)
		}
	}
	if got := AgeSeconds(3.6e3 * 5.2); got != "5h12m" {
		t.Errorf("AgeSeconds(18720) = %q, want 5h12m", got)
	}
}
