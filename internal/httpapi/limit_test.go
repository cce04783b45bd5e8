package httpapi

import (
	"fmt"
	"testing"
	"time"
)

// The limiters keep at most maxLimiterEntries keys, however many clients
// come, and still count the ones they keep.
func TestLimitersBounded(t *testing.T) {
	now := time.Now()
	f := newFailures(3, time.Minute)
	r := newRates(1, 2)
	for i := range maxLimiterEntries + 20_000 {
		key := fmt.Sprintf("10.%d", i)
		f.fail(key, now)
		r.take(key, now)
	}
	if n := f.size(); n > maxLimiterEntries {
		t.Errorf("failures kept %d keys; want at most %d", n, maxLimiterEntries)
	}
	r.mu.Lock()
	n := len(r.m)
	r.mu.Unlock()
	if n > maxLimiterEntries {
		t.Errorf("rates kept %d keys; want at most %d", n, maxLimiterEntries)
	}
	for range 3 {
		f.fail("alice", now)
	}
	if d := f.blocked("alice", now); d <= 0 || d > time.Minute {
		t.Errorf("blocked after 3 failures = %v; want the rest of the minute", d)
	}
	if d := f.blocked("alice", now.Add(time.Minute)); d != 0 {
		t.Errorf("blocked after the window = %v; want 0", d)
	}
	if r.take("bob", now) != 0 || r.take("bob", now) != 0 || r.take("bob", now) == 0 {
		t.Error("a burst of 2: want two tokens, then a wait")
	}
	if d := r.take("bob", now.Add(time.Second)); d != 0 {
		t.Errorf("a second later = %v; want a token", d)
	}
}
