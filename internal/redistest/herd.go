package redistest

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/onceguard/onceguard/lock"
)

// CountingWaiter is a backend that counts its acquire attempts (the round
// trips a release's wake-ups cost) and stays a lock.Waiter.
type CountingWaiter struct {
	lock.Backend
	lock.Waiter
	Attempts atomic.Int64
}

// CountAcquires wraps b, which must implement lock.Waiter.
func CountAcquires(t testing.TB, b lock.Backend) *CountingWaiter {
	t.Helper()
	w, ok := b.(lock.Waiter)
	if !ok {
		t.Fatalf("%T does not implement lock.Waiter", b)
	}
	return &CountingWaiter{Backend: b, Waiter: w}
}

// Acquire counts the attempt and passes it on.
func (c *CountingWaiter) Acquire(ctx context.Context, r lock.Request) (lock.Grant, error) {
	c.Attempts.Add(1)
	return c.Backend.Acquire(ctx, r)
}

// ReleaseWakesOneWaiter checks PITFALLS 12 (thundering herd) for b, a
// backend that implements lock.Waiter: a release wakes the first waiter
// only. With 20 blocked waiters (MaxBackoff 30s: none polls meanwhile),
// the release is followed by one acquire attempt, the first waiter's, not
// 20.
func ReleaseWakesOneWaiter(t *testing.T, b lock.Backend) {
	t.Helper()
	c := CountAcquires(t, b)
	l := lock.New(c, &lock.Options{MaxBackoff: 30 * time.Second})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	holder, err := l.TryAcquire(ctx, "herd", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	const waiters = 20
	var (
		wg  sync.WaitGroup
		got = make(chan *lock.Lease, waiters)
	)
	for range waiters {
		wg.Add(1)
		go func() {
			defer wg.Done()
			lease, err := l.Acquire(ctx, "herd", time.Minute)
			if err == nil {
				got <- lease
			} else if !errors.Is(err, context.Canceled) {
				t.Errorf("Acquire = %v", err)
			}
		}()
	}
	// Every waiter tried, subscribed and tried again: 2 attempts each.
	for deadline := time.Now().Add(20 * time.Second); c.Attempts.Load() < 1+2*waiters; {
		if time.Now().After(deadline) {
			t.Fatalf("%d acquire attempts; want %d before the release", c.Attempts.Load(), 1+2*waiters)
		}
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(200 * time.Millisecond) // nothing else is on its way
	before := c.Attempts.Load()
	if err := holder.Release(ctx); err != nil {
		t.Fatal(err)
	}
	var first *lock.Lease
	select {
	case first = <-got:
	case <-time.After(10 * time.Second):
		t.Fatal("no waiter got the lock within 10s of the release")
	}
	time.Sleep(500 * time.Millisecond) // room for a herd to show
	if n := c.Attempts.Load() - before; n != 1 {
		t.Errorf("acquire attempts after one release = %d; want 1 (the first waiter's)", n)
	}
	cancel() // the other waiters give up
	wg.Wait()
	_ = first.Release(context.Background())
}
