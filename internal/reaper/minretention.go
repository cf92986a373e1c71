//go:build !idemd_short_retention

package reaper

import "time"

// MinRetention guards against a typo ("--retention 72s") deleting keys
// that clients may still legitimately retry.
const MinRetention = time.Hour
