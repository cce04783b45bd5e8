package lock_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/onceguard/onceguard/lock"
	"github.com/onceguard/onceguard/lock/memlock"
)

// Do runs a function under the lock and cancels its context if the lease
// is lost while it runs.
func ExampleLocker_Do() {
	ctx := context.Background()
	locker := lock.New(&memlock.Backend{}, &lock.Options{AutoRenew: true})
	err := locker.Do(ctx, "payout:1001", 5*time.Second, func(ctx context.Context, lease *lock.Lease) error {
		fmt.Println("working under fence > 0:", lease.Fence() > 0)
		return nil
	})
	fmt.Println("err:", err)
	// Output:
	// working under fence > 0: true
	// err: <nil>
}

// A blocking Acquire bounded by its context returns an error that matches
// both ErrNotAcquired and the context's error.
func ExampleLocker_Acquire() {
	locker := lock.New(&memlock.Backend{}, nil)
	held, _ := locker.TryAcquire(context.Background(), "report", time.Minute)

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	_, err := locker.Acquire(ctx, "report", time.Minute)
	fmt.Println(errors.Is(err, lock.ErrNotAcquired), errors.Is(err, context.DeadlineExceeded))
	_ = held.Release(context.Background())
	// Output:
	// true true
}
