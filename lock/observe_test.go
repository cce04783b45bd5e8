package lock_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/onceguard/onceguard/lock"
	"github.com/onceguard/onceguard/lock/memlock"
)

// Observe sees every acquire (with its wait and result), every release
// (with how long the lease was held) and a lease lost to its TTL.
func TestObserve(t *testing.T) {
	var (
		mu     sync.Mutex
		events []lock.Event
	)
	l := lock.New(&memlock.Backend{}, &lock.Options{Observe: func(e lock.Event) {
		mu.Lock()
		events = append(events, e)
		mu.Unlock()
	}})
	ctx := context.Background()
	a, err := l.TryAcquire(ctx, "k", time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.TryAcquire(ctx, "k", time.Second); !errors.Is(err, lock.ErrNotAcquired) {
		t.Fatalf("second TryAcquire = %v; want ErrNotAcquired", err)
	}
	go func() {
		time.Sleep(20 * time.Millisecond)
		_ = a.Release(ctx)
	}()
	b, err := l.Acquire(ctx, "k", 30*time.Millisecond) // waits for the release
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(60 * time.Millisecond)
	if err := b.Release(ctx); !errors.Is(err, lock.ErrExpired) {
		t.Fatalf("Release after the TTL = %v; want ErrExpired", err)
	}

	mu.Lock()
	defer mu.Unlock()
	// The first release and the waiter's acquire race to report: the
	// waiter may be told before Release reports. Put them in order.
	if len(events) > 3 && events[2].Op == lock.OpAcquire {
		events[2], events[3] = events[3], events[2]
	}
	want := []struct {
		op   lock.Op
		wait bool
		err  error
	}{
		{lock.OpAcquire, false, nil},
		{lock.OpAcquire, false, lock.ErrNotAcquired},
		{lock.OpRelease, false, nil},
		{lock.OpAcquire, true, nil},
		{lock.OpLost, false, lock.ErrLost},
		{lock.OpRelease, false, lock.ErrExpired},
	}
	if len(events) != len(want) {
		t.Fatalf("events = %+v; want %d", events, len(want))
	}
	for i, w := range want {
		e := events[i]
		if e.Op != w.op || e.Wait != w.wait || e.Key != "k" || (w.err == nil) != (e.Err == nil) || (w.err != nil && !errors.Is(e.Err, w.err)) {
			t.Errorf("event %d = %+v (%v); want %v wait=%v err %v", i, e, e.Op, w.op, w.wait, w.err)
		}
	}
	if d := events[3].Duration; d < 10*time.Millisecond {
		t.Errorf("the blocking acquire waited %v; want about the 20ms until the release", d)
	}
	if d := events[2].Duration; d < 10*time.Millisecond {
		t.Errorf("the first lease was held %v; want about 20ms", d)
	}
}

// unreachable is a backend whose Release cannot reach it.
type unreachable struct{ fence int64 }

func (u *unreachable) Acquire(ctx context.Context, r lock.Request) (lock.Grant, error) {
	u.fence++
	return lock.Grant{Fence: u.fence}, nil
}

func (*unreachable) Release(ctx context.Context, key, owner string) error {
	return fmt.Errorf("release: %w", lock.ErrUnavailable)
}

func (*unreachable) Refresh(ctx context.Context, key, owner string, ttl time.Duration) error {
	return nil
}

// A Release that cannot reach the backend is an OpRelease with its error,
// not an OpLost: nothing ended the lease while it was held. One made after
// the TTL passed is both: the lease was lost (ErrExpired) first.
func TestObserveReleaseUnreachable(t *testing.T) {
	for _, late := range []bool{false, true} {
		var events []lock.Event
		l := lock.New(&unreachable{}, &lock.Options{Observe: func(e lock.Event) { events = append(events, e) }})
		ttl := time.Hour
		if late {
			ttl = 5 * time.Millisecond
		}
		lease, err := l.TryAcquire(t.Context(), "k", ttl)
		if err != nil {
			t.Fatal(err)
		}
		if late {
			time.Sleep(3 * ttl)
		}
		if err := lease.Release(t.Context()); !errors.Is(err, lock.ErrUnavailable) {
			t.Fatalf("late=%v: Release = %v; want ErrUnavailable", late, err)
		}
		if err := lease.Err(); !errors.Is(err, lock.ErrLost) {
			t.Errorf("late=%v: lease.Err() = %v; want ErrLost (the lease has ended)", late, err)
		}
		var ops []lock.Op
		for _, e := range events {
			ops = append(ops, e.Op)
			if e.Op == lock.OpLost && !errors.Is(e.Err, lock.ErrExpired) {
				t.Errorf("late=%v: OpLost with %v; want ErrExpired", late, e.Err)
			}
			if e.Op == lock.OpRelease && !errors.Is(e.Err, lock.ErrUnavailable) {
				t.Errorf("late=%v: OpRelease with %v; want ErrUnavailable", late, e.Err)
			}
		}
		want := []lock.Op{lock.OpAcquire, lock.OpRelease}
		if late {
			want = []lock.Op{lock.OpAcquire, lock.OpLost, lock.OpRelease}
		}
		if !slices.Equal(ops, want) {
			t.Errorf("late=%v: events %v; want %v", late, ops, want)
		}
	}
}

// refreshCounter counts refreshes that reach the backend.
type refreshCounter struct {
	lock.Backend
	refreshes atomic.Int64
}

func (r *refreshCounter) Refresh(ctx context.Context, key, owner string, ttl time.Duration) error {
	r.refreshes.Add(1)
	return r.Backend.Refresh(ctx, key, owner, ttl)
}

// PITFALLS 2: an auto-renewed lease is refreshed about every third of its
// TTL: often enough that one slow refresh does not lose it, not so often
// that it loads the backend. Held for 4 TTLs, that is about 12
// refreshes; the bounds are loose for a loaded machine (a ticker at the
// TTL would show 4 and lose the lease, one at TTL/10 about 40). The TTL
// is a second, as in locktest's AutoRenew: a renewal has about 2/3 of
// the TTL to land, and with 150ms (100ms of slack) the -race binary on
// a loaded two-core machine stalled past it and lost the lease.
func TestAutoRenewRate(t *testing.T) {
	b := &refreshCounter{Backend: &memlock.Backend{}}
	l := lock.New(b, &lock.Options{AutoRenew: true})
	const ttl = time.Second
	lease, err := l.TryAcquire(t.Context(), "renewed", ttl)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(4 * ttl)
	if err := lease.Err(); err != nil {
		t.Fatalf("lease lost while renewed: %v", err)
	}
	if err := lease.Release(t.Context()); err != nil {
		t.Fatal(err)
	}
	if n := b.refreshes.Load(); n < 4 || n > 24 {
		t.Errorf("%d refreshes over 4 TTLs; want about 12 (every TTL/3)", n)
	}
}
