package outbox

import (
	"testing"
	"time"
)

// The backoff doubles per failed attempt from MinBackoff up to MaxBackoff,
// jittered between half and all of it, and never overflows.
func TestBackoff(t *testing.T) {
	r := &Relay{opts: RelayOptions{MinBackoff: 100 * time.Millisecond, MaxBackoff: 30 * time.Second}}
	for attempts := range 80 {
		d := 100 * time.Millisecond
		for range min(attempts, 20) {
			d = min(2*d, 30*time.Second)
		}
		for range 50 {
			if got := r.backoff(attempts); got < d/2 || got > d {
				t.Fatalf("backoff(%d) = %v; want within [%v, %v]", attempts, got, d/2, d)
			}
		}
	}
}
