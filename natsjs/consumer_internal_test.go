package natsjs

import (
	"testing"
	"time"
)

func TestDefaultBackoff(t *testing.T) {
	in := &Inbox{}
	for _, c := range []struct {
		delivered uint64
		want      time.Duration
	}{{0, 100 * time.Millisecond}, {1, 100 * time.Millisecond}, {2, 200 * time.Millisecond}, {3, 400 * time.Millisecond},
		{10, 30 * time.Second}, {1 << 40, 30 * time.Second}} {
		if got := in.backoff(c.delivered); got != c.want {
			t.Errorf("backoff(%d) = %v; want %v", c.delivered, got, c.want)
		}
	}
	in.Backoff = func(n uint64) time.Duration { return time.Duration(n) * time.Second }
	if got := in.backoff(3); got != 3*time.Second {
		t.Errorf("with Inbox.Backoff: backoff(3) = %v; want 3s", got)
	}
}
