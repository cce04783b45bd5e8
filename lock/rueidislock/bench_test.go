//go:build unix

package rueidislock_test

import (
	"context"
	"crypto/rand"
	"fmt"
	"runtime"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/onceguard/onceguard/internal/redistest"
	"github.com/onceguard/onceguard/lock/rueidislock"
)

// BenchmarkCycleParallel measures one lock cycle (TryAcquire + Release)
// with 64 goroutines, each on a key of its own, on the shared Redis
// (ONCEGUARD_TEST_REDIS): the distinct-64 cell of the bench, without the
// harness, as lock/redislock's benchmark of the same name. Its keys carry
// a prefix of their own and are deleted afterwards. allocs/op and
// cpu-ns/op (this process's CPU time per cycle) are the figures to
// compare: on a small machine ns/op moves with whatever else runs.
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
			prefix := benchPrefix(b, rdb)
			opts := tc.opts
			opts.Prefix = prefix
			l := rueidislock.New(c, &opts)
			ctx := context.Background()
			var next atomic.Int64
			b.SetParallelism(max(1, 64/runtime.GOMAXPROCS(0)))
			b.ReportAllocs()
			b.ResetTimer()
			cpu0 := processCPU(b)
			b.RunParallel(func(pb *testing.PB) {
				key := fmt.Sprintf("k%d", next.Add(1))
				for pb.Next() {
					lease, err := l.TryAcquire(ctx, key, 10*time.Second)
					if err != nil {
						b.Error(err)
						return
					}
					if err := lease.Release(ctx); err != nil {
						b.Error(err)
						return
					}
				}
			})
			b.ReportMetric(float64(processCPU(b)-cpu0)/float64(b.N), "cpu-ns/op")
		})
	}
}

// processCPU returns the CPU time this process used so far, in ns.
func processCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// benchPrefix returns a key prefix unique to this run and deletes every key
// under it when the benchmark ends. It never touches any other key.
func benchPrefix(b *testing.B, rdb *redis.Client) string {
	prefix := "ogbench-rueidislock-" + rand.Text() + ":"
	b.Cleanup(func() {
		ctx := context.Background()
		iter := rdb.Scan(ctx, 0, prefix+"*", 1000).Iterator()
		var keys []string
		for iter.Next(ctx) {
			keys = append(keys, iter.Val())
		}
		if err := iter.Err(); err != nil {
			b.Error(err)
		}
		for len(keys) > 0 {
			n := min(len(keys), 500)
			if err := rdb.Unlink(ctx, keys[:n]...).Err(); err != nil {
				b.Error(err)
			}
			keys = keys[n:]
		}
	})
	return prefix
}
