package fallback_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/onceguard/onceguard/lock"
	"github.com/onceguard/onceguard/lock/fallback"
	"github.com/onceguard/onceguard/lock/memlock"
)

// switchable is a primary that answers ErrUnavailable while down.
type switchable struct {
	lock.Backend
	down atomic.Bool
}

func (s *switchable) Acquire(ctx context.Context, r lock.Request) (lock.Grant, error) {
	if s.down.Load() {
		return lock.Grant{}, fmt.Errorf("down: %w", lock.ErrUnavailable)
	}
	return s.Backend.Acquire(ctx, r)
}

// A lease the secondary granted during the outage and that its holder
// keeps renewing is respected only for Drain (the longest TTL granted
// while open) after the breaker closed: then the primary grants the same
// lock to another holder while the first still holds it and its refreshes
// still succeed, in one process, with no outage going on.
func TestRenewedSecondaryLeaseOutlivesDrain(t *testing.T) {
	ctx := context.Background()
	primary := &switchable{Backend: &memlock.Backend{}}
	b := fallback.New(primary, &memlock.Backend{}, &fallback.Options{Cooldown: 10 * time.Millisecond})
	const key, ttl = "account:1", 200 * time.Millisecond

	primary.down.Store(true)
	if _, err := b.Acquire(ctx, lock.Request{Key: key, Owner: "first", TTL: ttl}); err != nil {
		t.Fatalf("acquire during the outage: %v", err)
	}
	primary.down.Store(false)
	time.Sleep(20 * time.Millisecond)
	if s := b.Probe(ctx); s != fallback.Closed {
		t.Fatalf("breaker %v after the primary came back", s)
	}
	// The first holder renews its lease (a long job), past the drain.
	for range 5 {
		time.Sleep(ttl / 2)
		if err := b.Refresh(ctx, key, "first", ttl); err != nil {
			t.Fatalf("refresh of the first holder's lease: %v", err)
		}
	}
	if _, err := b.Acquire(ctx, lock.Request{Key: key, Owner: "second", TTL: ttl}); err == nil {
		err := b.Refresh(ctx, key, "first", ttl)
		t.Fatalf("a second holder got the lock on the primary while the first still holds it on the secondary (its refresh now: %v)", err)
	}
}
