package redisstore_test

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/onceguard/onceguard/idempotency"
	"github.com/onceguard/onceguard/idempotency/redisstore"
	"github.com/onceguard/onceguard/idempotency/storetest"
	"github.com/onceguard/onceguard/internal/redistest"
)

func sharedRedis(t *testing.T) *redis.Client {
	url := os.Getenv("ONCEGUARD_TEST_REDIS")
	if url == "" {
		t.Skip("ONCEGUARD_TEST_REDIS not set; skipping the integration test")
	}
	opt, err := redis.ParseURL(url)
	if err != nil {
		t.Fatal(err)
	}
	rdb := redis.NewClient(opt)
	t.Cleanup(func() { _ = rdb.Close() })
	if err := rdb.Ping(context.Background()).Err(); err != nil {
		t.Fatalf("PING = %v", err)
	}
	return rdb
}

func TestStore(t *testing.T) {
	rdb := sharedRedis(t)
	prefix := fmt.Sprintf("storetest:%d:", time.Now().UnixNano())
	storetest.Run(t, func(*testing.T) idempotency.FullStore {
		return redisstore.New(rdb, &redisstore.Options{Prefix: prefix})
	})
}

func TestStoreCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a 3-node Redis Cluster")
	}
	c := redistest.StartCluster(t, 3)
	rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Addrs()})
	t.Cleanup(func() { _ = rdb.Close() })
	storetest.Run(t, func(*testing.T) idempotency.FullStore { return redisstore.New(rdb, nil) })
}
