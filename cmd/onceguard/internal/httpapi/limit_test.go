package httpapi

import (
	"fmt"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/onceguard/onceguard/cmd/onceguard/internal/app"
)

// The limiters keep at most maxLimiterEntries keys, however many clients
// come, and still count the ones they keep.
func TestLimitersBounded(t *testing.T) {
	now := time.Now()
	f := newFailures(3, time.Minute)
	r := newRates(1, 2)
	for i := range maxLimiterEntries + 20_000 {
		key := fmt.Sprintf("10.%d", i)
		f.reserve(key, now)
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
	for i := range 3 {
		if d := f.reserve("alice", now); d != 0 {
			t.Fatalf("attempt %d refused (%v); want 3 let through", i+1, d)
		}
	}
	if d := f.reserve("alice", now); d <= 0 || d > time.Minute {
		t.Errorf("a 4th attempt after 3 = %v; want refused for the rest of the minute", d)
	}
	f.undo("alice") // one of the three succeeded after all
	if d := f.reserve("alice", now); d != 0 {
		t.Errorf("after one attempt was given back = %v; want one more let through", d)
	}
	if d := f.reserve("alice", now.Add(time.Minute)); d != 0 {
		t.Errorf("after the window = %v; want a fresh count", d)
	}
	if r.take("bob", now) != 0 || r.take("bob", now) != 0 || r.take("bob", now) == 0 {
		t.Error("a burst of 2: want two tokens, then a wait")
	}
	if d := r.take("bob", now.Add(time.Second)); d != 0 {
		t.Errorf("a second later = %v; want a token", d)
	}
}

// reserveAll takes an attempt on every limiter or on none: when a later
// one refuses, the earlier ones get theirs back.
func TestReserveAllOrNone(t *testing.T) {
	now := time.Now()
	pair, addr := newFailures(5, time.Minute), newFailures(1, time.Minute)
	if d := reserveAll(now, attempt{pair, "alice|10.0.0.1"}, attempt{addr, "10.0.0.1"}); d != 0 {
		t.Fatalf("first attempt refused (%v)", d)
	}
	for range 3 {
		if d := reserveAll(now, attempt{pair, "alice|10.0.0.1"}, attempt{addr, "10.0.0.1"}); d <= 0 {
			t.Fatal("attempt over the address's limit of 1 let through")
		}
	}
	// The pair spent one attempt, not four: four more are allowed on it.
	for i := range 4 {
		if d := reserveAll(now, attempt{pair, "alice|10.0.0.1"}); d != 0 {
			t.Fatalf("pair attempt %d refused (%v): the refused tries were not given back", i+2, d)
		}
	}
	if d := reserveAll(now, attempt{pair, "alice|10.0.0.1"}); d <= 0 {
		t.Error("pair's 6th attempt let through; want its limit of 5")
	}
}

// A busy answer (the hashing slots full, a lock not had) is 503 with
// Retry-After 1.
func TestBusyAnswer(t *testing.T) {
	w := httptest.NewRecorder()
	s := &server{}
	s.fail(w, httptest.NewRequest("POST", "/", nil), app.ErrHashBusy)
	if w.Code != 503 || w.Header().Get("Retry-After") != "1" {
		t.Errorf("busy = %d (Retry-After %q); want 503 busy, Retry-After 1", w.Code, w.Header().Get("Retry-After"))
	}
}
