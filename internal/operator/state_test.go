package operator

import (
	"strings"
	"testing"
	"time"

	"github.com/idemd/idemd/internal/review"
)

// TestKeyStateAndRetryRefusal: the decision of what a key's state is and
// whether a retry applies, without a database.
func TestKeyStateAndRetryRefusal(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
	at := func(d time.Duration) *time.Time { v := now.Add(d); return &v }
	key := func(mod func(k *Key)) *Key {
		k := &Key{CreatedAt: now.Add(-2 * time.Hour), RecoveryPoint: "ride_created"}
		if mod != nil {
			mod(k)
		}
		return k
	}
	open := []Review{{Reason: review.ReasonCompleterGaveUp}}
	const horizon = 23 * time.Hour
	for _, c := range []struct {
		name    string
		k       *Key
		reviews []Review
		state   string
		refusal string // "" retryable, else a part of the reason
	}{
		{"gone", nil, open, StateGone, "reaped"},
		{"finished", key(func(k *Key) { k.RecoveryPoint = "finished"; k.CompleterGaveUpAt = at(-time.Hour) }), open, StateFinished, "finished"},
		{"gave up", key(func(k *Key) { k.CompleterGaveUpAt = at(-time.Minute); k.CompleterAttempts = 20 }), open, StateGaveUp, ""},
		{"gave up, review resolved", key(func(k *Key) { k.CompleterGaveUpAt = at(-time.Minute) }), nil, StateGaveUp, ""},
		{"leased", key(func(k *Key) { k.CompleterLeasedUntil = at(time.Minute); k.CompleterAttempts = 2 }), nil, StateReplaying, "replaying"},
		{"lease expired", key(func(k *Key) { k.CompleterLeasedUntil = at(-time.Minute); k.CompleterAttempts = 2 }), nil, StateUnfinished, ""},
		{"backing off", key(func(k *Key) { k.CompleterAttempts = 3; k.CompleterNextAttemptAt = at(time.Minute) }), nil, StateBackingOff, ""},
		{"past horizon", key(func(k *Key) { k.CreatedAt = now.Add(-horizon); k.CompleterGaveUpAt = at(0) }), open, StateGaveUp, "--give-up-after"},
		{"past horizon, not given up", key(func(k *Key) { k.CreatedAt = now.Add(-30 * time.Hour) }), nil, StatePastHorizon, "--give-up-after"},
		{"nothing to reset", key(nil), nil, StateUnfinished, "nothing to reset"},
	} {
		if got := KeyState(c.k, now, horizon); got != c.state {
			t.Errorf("%s: state %s, want %s", c.name, got, c.state)
		}
		got := retryRefusal(c.k, c.reviews, now, horizon)
		if (c.refusal == "") != (got == "") || !strings.Contains(got, c.refusal) {
			t.Errorf("%s: refusal %q, want one with %q", c.name, got, c.refusal)
		}
	}
}

func TestKeyRefCheck(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		ref  KeyRef
		want string
	}{
		{KeyRef{ID: 3}, ""},
		{KeyRef{UserID: 4, Key: "k"}, ""},
		{KeyRef{}, "name a key"},
		{KeyRef{UserID: 4}, "--key is required"},
		{KeyRef{Key: "k"}, "--user-id is required"},
		{KeyRef{ID: 3, Key: "k"}, "not both"},
		{KeyRef{ID: -1}, "positive"},
	} {
		got := strings.Join(c.ref.Check(), "; ")
		if (c.want == "") != (got == "") || !strings.Contains(got, c.want) {
			t.Errorf("%+v: %q, want %q", c.ref, got, c.want)
		}
	}
}
