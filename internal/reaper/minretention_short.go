//go:build idemd_short_retention

package reaper

import "time"

// MinRetention of a reaper built with the tag idemd_short_retention: the
// soak (internal/testing/e2e/soak) compresses hours of a deployment into
// half an hour, so its reaper deletes the keys of its own traffic minutes
// after they were made, as a production reaper does hours after. No
// release is built with the tag.
const MinRetention = time.Minute
