package idemgrpc_test

import (
	"testing"

	"github.com/onceguard/onceguard/idempotency/idemgrpc/idemgrpctest"
	"github.com/onceguard/onceguard/idempotency/idemstore"
	"github.com/onceguard/onceguard/idempotency/memstore"
	"github.com/onceguard/onceguard/idempotency/redisstore"
	"github.com/onceguard/onceguard/internal/redistest"
)

func TestConformanceMemstore(t *testing.T) {
	idemgrpctest.Run(t, func(*testing.T) idemstore.Store { return new(memstore.Store) })
}

// On the Redis of ONCEGUARD_TEST_REDIS (skipped without it), under a
// prefix of each server's own: its keys are deleted when the test ends.
func TestConformanceRedisstore(t *testing.T) {
	rdb := redistest.Shared(t)
	idemgrpctest.Run(t, func(t *testing.T) idemstore.Store {
		return redisstore.New(rdb, &redisstore.Options{Prefix: redistest.Prefix(t, rdb, "idemgrpc")})
	})
}
