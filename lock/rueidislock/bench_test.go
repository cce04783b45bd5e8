//go:build unix

package rueidislock_test

import (
	"testing"

	"github.com/onceguard/onceguard/internal/redistest"
	"github.com/onceguard/onceguard/lock"
	"github.com/onceguard/onceguard/lock/locktest"
	"github.com/onceguard/onceguard/lock/rueidislock"
)

// BenchmarkCycleParallel is lock/redislock's benchmark of the same name on
// this backend: lock cycles from 64 goroutines on keys of their own, on
// the shared Redis, with counter and with clock fences (see
// locktest.Cycles). Its keys are deleted afterwards.
func BenchmarkCycleParallel(b *testing.B) {
	for _, tc := range []struct {
		name string
		opts rueidislock.Options
	}{
		{"counter", rueidislock.Options{}},
		{"clock", rueidislock.Options{ClockFences: true}},
	} {
		b.Run(tc.name, func(b *testing.B) {
			rdb := redistest.Shared(b)
			c := shared(b)
			opts := tc.opts
			opts.Prefix = redistest.Prefix(b, rdb, "ogbench-rueidislock")
			locktest.Cycles(b, lock.New(rueidislock.New(c, &opts), nil))
		})
	}
}
