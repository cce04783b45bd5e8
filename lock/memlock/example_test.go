package memlock_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/onceguard/onceguard/lock"
	"github.com/onceguard/onceguard/lock/memlock"
)

func Example() {
	ctx := context.Background()
	locker := lock.New(&memlock.Backend{}, nil)

	lease, err := locker.Acquire(ctx, "order:42", 10*time.Second)
	if err != nil {
		panic(err)
	}
	_, err = locker.TryAcquire(ctx, "order:42", 10*time.Second)
	fmt.Println("second holder:", errors.Is(err, lock.ErrNotAcquired))

	fmt.Println("release:", lease.Release(ctx))
	fmt.Println("release again:", errors.Is(lease.Release(ctx), lock.ErrNotHeld))
	// Output:
	// second holder: true
	// release: <nil>
	// release again: true
}

// Fencing tokens let the protected resource refuse a stale holder: one
// whose lease ran out (a GC pause, a stalled VM) while a newer holder
// already wrote.
func Example_fencing() {
	ctx := context.Background()
	locker := lock.New(&memlock.Backend{}, nil)

	var lastFence int64 // kept by the resource, e.g. a column next to the data
	write := func(fence int64) error {
		if fence <= lastFence {
			return errors.New("stale fence: write refused")
		}
		lastFence = fence
		return nil
	}

	slow, _ := locker.TryAcquire(ctx, "account:7", 50*time.Millisecond)
	<-slow.Done() // paused past its TTL: the lease is lost
	fmt.Println("lost:", errors.Is(slow.Err(), lock.ErrLost))

	next, _ := locker.Acquire(ctx, "account:7", time.Second) // waits out the TTL
	fmt.Println("new holder writes:", write(next.Fence()))
	fmt.Println("old holder writes:", write(slow.Fence()))
	_ = next.Release(ctx)
	// Output:
	// lost: true
	// new holder writes: <nil>
	// old holder writes: stale fence: write refused
}
