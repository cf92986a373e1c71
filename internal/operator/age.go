package operator

import (
	"fmt"
	"time"
)

// Age renders a duration the way operators read ages, in idemctl's tables
// and on the console's pages alike: 3d4h, 5h12m, 40s.
func Age(d time.Duration) string {
	d = d.Round(time.Second)
	switch {
	case d >= 24*time.Hour:
		return fmt.Sprintf("%dd%dh", d/(24*time.Hour), (d%(24*time.Hour))/time.Hour)
	case d >= time.Hour:
		return fmt.Sprintf("%dh%dm", d/time.Hour, (d%time.Hour)/time.Minute)
	default:
		return d.String()
	}
}

// AgeSeconds is Age of a number of seconds (the database's epoch
// differences).
func AgeSeconds(seconds float64) string {
	return Age(time.Duration(seconds * float64(time.Second)))
}
