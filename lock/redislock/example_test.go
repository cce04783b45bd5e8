package redislock_test

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/onceguard/onceguard/lock"
	"github.com/onceguard/onceguard/lock/redislock"
)

// The backend takes your go-redis client as it is: a *redis.Client, a
// *redis.ClusterClient or a Sentinel-backed client.
func Example() {
	url := os.Getenv("ONCEGUARD_TEST_REDIS")
	if url == "" {
		url = "redis://127.0.0.1:6379/0"
	}
	opt, err := redis.ParseURL(url)
	if err != nil {
		panic(err)
	}
	rdb := redis.NewClient(opt)
	defer rdb.Close()

	locker := lock.New(redislock.New(rdb, nil), &lock.Options{AutoRenew: true})
	ctx := context.Background()
	lease, err := locker.Acquire(ctx, fmt.Sprintf("example:order:%d", time.Now().UnixNano()), 10*time.Second)
	if err != nil {
		fmt.Println("no lock:", err) // errors.Is(err, lock.ErrUnavailable) when Redis is down
		return
	}
	defer lease.Release(ctx)
	fmt.Println("holding, fence", lease.Fence() > 0)
}
