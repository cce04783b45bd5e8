package idemzero_test

import (
	"testing"

	"github.com/onceguard/onceguard/idempotency/adaptertest"
	"github.com/onceguard/onceguard/idempotency/idemstore"
	"github.com/onceguard/onceguard/idempotency/memstore"
	"github.com/onceguard/onceguard/idempotency/redisstore"
	"github.com/onceguard/onceguard/internal/redistest"
)

// The shared conformance suite against a real server of the framework
// (start), on the memory store and, with ONCEGUARD_TEST_REDIS, on Redis.
func TestConformance(t *testing.T) {
	adaptertest.Run(t, start, func(*testing.T) idemstore.FullStore { return &memstore.Store{} })
}

func TestConformanceRedis(t *testing.T) {
	rdb := redistest.Shared(t)
	prefix := redistest.Prefix(t, rdb, "idemzero") // its keys are deleted when the test ends
	adaptertest.Run(t, start, func(*testing.T) idemstore.FullStore {
		return redisstore.New(rdb, &redisstore.Options{Prefix: prefix})
	})
}
