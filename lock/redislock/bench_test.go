//go:build unix

package redislock_test

import (
	"testing"

	"github.com/onceguard/onceguard/internal/redistest"
	"github.com/onceguard/onceguard/lock"
	"github.com/onceguard/onceguard/lock/locktest"
	"github.com/onceguard/onceguard/lock/redislock"
)

// BenchmarkCycleParallel measures one lock cycle (TryAcquire + Release)
// with 64 goroutines, each on a key of its own, on the shared Redis
// (ONCEGUARD_TEST_REDIS), with counter and with clock fences (see
// locktest.Cycles). Its keys carry a prefix of their own and are deleted
// afterwards. allocs/op and cpu-ns/op are the figures to compare.
func BenchmarkCycleParallel(b *testing.B) {
	for _, tc := range []struct {
		name string
		opts redislock.Options
	}{
		{"counter", redislock.Options{}},
		{"clock", redislock.Options{ClockFences: true}},
	} {
		b.Run(tc.name, func(b *testing.B) {
			rdb := redistest.Shared(b)
			opts := tc.opts
			opts.Prefix = redistest.Prefix(b, rdb, "ogbench-redislock")
			locktest.Cycles(b, lock.New(redislock.New(rdb, &opts), nil))
		})
	}
}
