package memlock_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/onceguard/onceguard/lock"
	"github.com/onceguard/onceguard/lock/memlock"
)

// Blocked waiters are served in arrival order, and tries made all along
// never jump the queue.
func TestFIFOAndTries(t *testing.T) {
	b := &memlock.Backend{}
	l := lock.New(b, nil)
	ctx := context.Background()
	holder, err := l.TryAcquire(ctx, "q", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var order []int
	var wg sync.WaitGroup
	for i := 1; i <= 4; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			lease, err := l.Acquire(ctx, "q", time.Minute)
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			order = append(order, i)
			mu.Unlock()
			time.Sleep(5 * time.Millisecond)
			_ = lease.Release(ctx)
		}()
		time.Sleep(30 * time.Millisecond) // queued before the next
	}
	stop := make(chan struct{})
	var jumped atomic.Int32
	var tries sync.WaitGroup
	tries.Add(1)
	go func() {
		defer tries.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			if lease, err := l.TryAcquire(ctx, "q", time.Minute); err == nil {
				mu.Lock()
				if len(order) < 4 { // a waiter not yet served
					jumped.Add(1)
				}
				mu.Unlock()
				_ = lease.Release(ctx)
			} else if !errors.Is(err, lock.ErrNotAcquired) {
				t.Error(err)
			}
		}
	}()
	_ = holder.Release(ctx)
	wg.Wait()
	close(stop)
	tries.Wait()
	if n := jumped.Load(); n > 0 {
		t.Errorf("%d tries took the lock while waiters were queued", n)
	}
	if len(order) != 4 || order[0] != 1 || order[1] != 2 || order[2] != 3 || order[3] != 4 {
		t.Errorf("served %v; want [1 2 3 4]", order)
	}
}

// A 1ms lease: after it expires, the old owner's release and refresh are
// refused (ErrExpired, then ErrNotHeld once another holds it), and the
// fence of the next holder is above.
func TestOneMillisecond(t *testing.T) {
	b := &memlock.Backend{}
	ctx := context.Background()
	for range 200 {
		g1, err := b.Acquire(ctx, lock.Request{Key: "m", Owner: "a", TTL: time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(2 * time.Millisecond)
		if err := b.Refresh(ctx, "m", "a", time.Minute); !errors.Is(err, lock.ErrExpired) {
			t.Fatalf("refresh after expiry = %v", err)
		}
		g2, err := b.Acquire(ctx, lock.Request{Key: "m", Owner: "b", TTL: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		if g2.Fence <= g1.Fence {
			t.Fatalf("fence %d after %d", g2.Fence, g1.Fence)
		}
		if err := b.Release(ctx, "m", "a"); !errors.Is(err, lock.ErrNotHeld) || errors.Is(err, lock.ErrExpired) {
			t.Fatalf("stale release = %v; want ErrNotHeld", err)
		}
		if err := b.Release(ctx, "m", "b"); err != nil {
			t.Fatal(err)
		}
	}
}
