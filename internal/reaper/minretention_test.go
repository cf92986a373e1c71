package reaper

import (
	"testing"
	"time"
)

// TestMinRetention: a retention below the minimum is refused, the minimum
// itself is not (an hour in every release build; a minute in the soak's,
// built with idemd_short_retention).
func TestMinRetention(t *testing.T) {
	e := Eligibility{Retention: MinRetention - time.Second, LockWindow: time.Hour}
	if p := e.Check(); len(p) != 1 {
		t.Errorf("--retention %s: problems %q, want the minimum's", e.Retention, p)
	}
	e.Retention = MinRetention
	if p := e.Check(); len(p) != 0 {
		t.Errorf("--retention %s: problems %q, want none", e.Retention, p)
	}
}
