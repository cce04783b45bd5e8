package redisstore_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/onceguard/onceguard/idempotency"
	"github.com/onceguard/onceguard/idempotency/redisstore"
	"github.com/onceguard/onceguard/idempotency/storetest"
	"github.com/onceguard/onceguard/internal/redistest"
)

func TestStore(t *testing.T) {
	rdb := redistest.Shared(t)
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
