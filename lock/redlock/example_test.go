package redlock_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/onceguard/onceguard/lock"
	"github.com/onceguard/onceguard/lock/redlock"
)

// A lock over three independent Redis nodes, on your own go-redis clients:
// it is held when two of the three granted it, so it survives losing one.
func Example() {
	var nodes []redis.UniversalClient
	for _, addr := range []string{"10.0.0.1:6379", "10.0.0.2:6379", "10.0.0.3:6379"} {
		c := redis.NewClient(&redis.Options{Addr: addr})
		defer c.Close()
		nodes = append(nodes, c)
	}
	backend, err := redlock.New(nodes, nil)
	if err != nil {
		panic(err) // only for no clients at all
	}
	locker := lock.New(backend, &lock.Options{AutoRenew: true})

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	lease, err := locker.Acquire(ctx, "payout:1001", 10*time.Second)
	switch {
	case errors.Is(err, lock.ErrUnavailable):
		fmt.Println("no majority of nodes answers:", err)
		return
	case errors.Is(err, lock.ErrNotAcquired):
		fmt.Println("still held by someone else after 2s")
		return
	case err != nil:
		panic(err)
	}
	defer lease.Release(ctx) // on every node, on a context of its own
	fmt.Println("send fence", lease.Fence(), "with every write; stop at <-lease.Done()")
}

// The Backend with its options: a node that does not answer within
// NodeTimeout counts as a "no", so a dead node costs at most that much.
func ExampleNew_options() {
	var nodes []redis.UniversalClient
	for _, addr := range []string{"10.0.0.1:6379", "10.0.0.2:6379", "10.0.0.3:6379", "10.0.0.4:6379", "10.0.0.5:6379"} {
		nodes = append(nodes, redis.NewClient(&redis.Options{Addr: addr}))
	}
	b, err := redlock.New(nodes, &redlock.Options{NodeTimeout: 100 * time.Millisecond})
	if err != nil {
		panic(err)
	}
	fmt.Println("quorum:", b.Quorum()) // 3 of 5
	locker := lock.New(b, &lock.Options{MaxWait: time.Second})

	err = locker.Do(context.Background(), "report:daily", 30*time.Second, func(ctx context.Context, lease *lock.Lease) error {
		// ctx ends if the lease is lost while this runs.
		return nil
	})
	switch {
	case errors.Is(err, lock.ErrNotAcquired):
		fmt.Println("another instance is writing the report")
	case err != nil:
		fmt.Println("no report:", err) // lock.ErrUnavailable: fewer than 3 nodes answer
	}
}
