package redisstore_test

import (
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/onceguard/onceguard/idempotency/idemstore"
	"github.com/onceguard/onceguard/idempotency/redisstore"
	"github.com/onceguard/onceguard/idempotency/storetest"
	"github.com/onceguard/onceguard/internal/redistest"
	"github.com/onceguard/onceguard/token"
)

func TestStore(t *testing.T) {
	rdb := redistest.Shared(t)
	prefix := redistest.Prefix(t, rdb, "storetest") // its keys are deleted when the test ends
	storetest.Run(t, func(*testing.T) idemstore.FullStore {
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
	storetest.Run(t, func(*testing.T) idemstore.FullStore { return redisstore.New(rdb, nil) })
}

// Every key the store writes expires on its own: a token that is never
// used is gone from Redis at its expiry, not kept forever.
func TestTokenKeyExpires(t *testing.T) {
	rdb := redistest.Shared(t)
	prefix := redistest.Prefix(t, rdb, "storetest")
	s := redisstore.New(rdb, &redisstore.Options{Prefix: prefix})
	ctx := t.Context()
	if err := s.PutToken(ctx, token.Record{Hash: "h", Subject: "u", Purpose: "p", ExpiresAt: time.Now().Add(time.Minute)}); err != nil {
		t.Fatal(err)
	}
	ttl, err := rdb.PTTL(ctx, prefix+"tok:{h}").Result()
	if err != nil || ttl <= 0 || ttl > time.Minute {
		t.Errorf("PTTL of an issued token = %v, %v; want its minute", ttl, err)
	}
	_ = rdb.Del(ctx, prefix+"tok:{h}")
}
