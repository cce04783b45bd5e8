//go:build unix

package redislock_test

import (
	"context"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

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

// minimalRelease is the hand-written compare-and-delete release.
const minimalRelease = `if redis.call("get", KEYS[1]) == ARGV[1] then return redis.call("del", KEYS[1]) else return 0 end`

// BenchmarkSerial is one goroutine's lock cycles on one key: onceguard's,
// and the hand-written minimal design's with a fence (SET NX PX and INCR
// in one pipeline, then the compare-and-delete script), which is what no
// fenced lock can skip. cpu-ns/op is this process's CPU time per cycle.
func BenchmarkSerial(b *testing.B) {
	rdb := redistest.Shared(b)
	ctx := context.Background()
	b.Run("onceguard", func(b *testing.B) {
		l := lock.New(redislock.New(rdb, &redislock.Options{Prefix: redistest.Prefix(b, rdb, "ogbench-serial")}), nil)
		b.ReportAllocs()
		cpu0 := cpuNow(b)
		for b.Loop() {
			lease, err := l.TryAcquire(ctx, "k", 10*time.Second)
			if err != nil {
				b.Fatal(err)
			}
			if err := lease.Release(ctx); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(cpuNow(b)-cpu0)/float64(b.N), "cpu-ns/op")
	})
	b.Run("minimal+fence", func(b *testing.B) {
		key := redistest.Prefix(b, rdb, "ogbench-serial-minimal") + "k"
		release := redis.NewScript(minimalRelease)
		keys := []string{key}
		pipe := rdb.Pipeline()
		b.ReportAllocs()
		cpu0 := cpuNow(b)
		var n int64
		for b.Loop() {
			n++
			tok := strconv.FormatInt(n, 10)
			set := pipe.Do(ctx, "set", key, tok, "nx", "px", 10000)
			incr := pipe.Incr(ctx, key+":fence")
			_, _ = pipe.Exec(ctx)
			if err := set.Err(); err != nil {
				b.Fatal(err)
			}
			if err := incr.Err(); err != nil {
				b.Fatal(err)
			}
			if v, err := release.Run(ctx, rdb, keys, tok).Int64(); err != nil || v != 1 {
				b.Fatal(v, err)
			}
		}
		b.ReportMetric(float64(cpuNow(b)-cpu0)/float64(b.N), "cpu-ns/op")
	})
}

func cpuNow(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
