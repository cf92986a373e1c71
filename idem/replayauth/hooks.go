package replayauth

import (
	"fmt"
	"time"

	"github.com/idemd/idemd/internal/replayhook"
)

// Test-only capabilities, reachable from idemd's own tests only (see
// github.com/idemd/idemd/internal/replayhook and github.com/idemd/idemd/internal/replaytest).
func init() {
	replayhook.SignAt = func(signer any, ts int64, nonce string, req any) string {
		return signer.(*Signer).signAt(ts, nonce, req.(Request))
	}
	replayhook.WithClock = func(x any, now func() time.Time) any {
		switch x := x.(type) {
		case *Signer:
			return x.withClock(now)
		case *Verifier:
			return x.withClock(now)
		}
		panic(fmt.Sprintf("replayauth: withClock of %T", x))
	}
	replayhook.Parse = func(h string) (int64, string, int64, error) {
		p, err := parse(h)
		return p.Timestamp, p.Nonce, p.UserID, err
	}
}
