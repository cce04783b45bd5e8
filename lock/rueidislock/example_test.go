package rueidislock_test

import (
	"context"
	"fmt"
	"time"

	"github.com/redis/rueidis"

	"github.com/onceguard/onceguard/lock"
	"github.com/onceguard/onceguard/lock/rueidislock"
)

// The backend takes your rueidis client as it is: a single node, Sentinel
// or Cluster client, with whatever options you gave it. Processes using
// lock/redislock on the same Redis share these locks.
func Example() {
	client, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{"127.0.0.1:6379"}})
	if err != nil {
		fmt.Println("no Redis:", err)
		return
	}
	defer client.Close()

	locker := lock.New(rueidislock.New(client, nil), &lock.Options{AutoRenew: true})
	ctx := context.Background()
	lease, err := locker.Acquire(ctx, "order:42", 10*time.Second)
	if err != nil {
		fmt.Println("no lock:", err) // errors.Is(err, lock.ErrUnavailable) when Redis is down
		return
	}
	defer lease.Release(ctx)
	fmt.Println("holding, fence", lease.Fence())
}
