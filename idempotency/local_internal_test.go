package idempotency

import (
	"testing"
	"time"

	"github.com/onceguard/onceguard/idempotency/idemstore"
)

// A window a Deferred call's record holds here is let go when the key is
// freed by any of its calls: also by the one Resume began without
// Deferred (a recovered record whose handler then failed).
func TestDropWindowAnyCall(t *testing.T) {
	var l local
	now := time.Now()
	until := now.Add(time.Minute)
	st := &idemstore.Start{WindowID: "w", WindowUntil: until, Lease: "L1"}
	first := &Call{ID: "k1", Lease: "L1", windowID: "w", deferred: &deferral{start: st}}
	done, _ := l.claim("k1")
	first.deferred.done = done
	if _, ok := l.holdWindow("w", "k1", "L1", now, until); !ok {
		t.Fatal("a free window was refused")
	}
	// Another attempt of k1 (its own lease) freed while the first runs:
	// the first's pending hold stays.
	l.dropWindow(&Call{ID: "k1", Lease: "L2", windowID: "w"})
	if _, ok := l.holdWindow("w", "k2", "L3", now, until); ok {
		t.Fatal("another attempt of k1 let go of the window k1's running attempt holds")
	}
	first.Created()
	l.finish(first)
	if _, ok := l.holdWindow("w", "k2", "L3", now, until); ok {
		t.Fatal("the window k1's record holds was given to k2")
	}
	resumed := &Call{ID: "k1", Lease: "L4", windowID: "w"} // Resume's call: not Deferred, its own lease
	l.dropWindow(resumed)
	if _, ok := l.holdWindow("w", "k2", "L3", now, until); !ok {
		t.Error("k1 freed, its window is still held here")
	}
	l.dropWindow(&Call{ID: "k3", Lease: "L3", windowID: "w"}) // another key's call frees only its own
	if _, ok := l.holdWindow("w", "k4", "L5", now, until); ok {
		t.Error("k3's release let go of the window k2 holds")
	}
}
