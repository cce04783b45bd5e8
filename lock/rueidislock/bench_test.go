//go:build unix

package rueidislock_test

import (
	"context"
	"fmt"
	"runtime"
	"strconv"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/rueidis"

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

// minimalRelease is the hand-written compare-and-delete release.
const minimalRelease = `if redis.call("get", KEYS[1]) == ARGV[1] then return redis.call("del", KEYS[1]) else return 0 end`

// BenchmarkMinimalParallel is the hand-written minimal lock on the same
// client, for the profile next to BenchmarkCycleParallel: SET NX PX of a
// token, then the compare-and-delete script; no fence, no lease, no
// renewal (bench's minimal-rueidis row). Same goroutines and keys.
func BenchmarkMinimalParallel(b *testing.B) {
	rdb := redistest.Shared(b)
	c := shared(b)
	prefix := redistest.Prefix(b, rdb, "ogbench-minimal-rueidis")
	release := rueidis.NewLuaScript(minimalRelease)
	ctx := context.Background()
	var next atomic.Int64
	b.SetParallelism(max(1, 64/runtime.GOMAXPROCS(0)))
	b.ReportAllocs()
	cpu0 := cpuNow(b)
	defer func() { b.ReportMetric(float64(cpuNow(b)-cpu0)/float64(b.N), "cpu-ns/op") }()
	b.RunParallel(func(pb *testing.PB) {
		g := next.Add(1)
		key := fmt.Sprintf("%sk%d", prefix, g)
		keys := []string{key}
		var n int64
		for pb.Next() {
			n++
			tok := fmt.Sprintf("t%d-%d", g, n)
			if err := c.Do(ctx, c.B().Set().Key(key).Value(tok).Nx().PxMilliseconds(10000).Build()).Error(); err != nil {
				b.Error(err)
				return
			}
			if v, err := release.Exec(ctx, c, keys, []string{tok}).AsInt64(); err != nil || v != 1 {
				b.Error(v, err)
				return
			}
		}
	})
}

// BenchmarkSerial is one goroutine's lock cycles, onceguard's and the
// minimal design's, on one key each: at one goroutine a cycle is two
// round trips, and what either adds to them is the whole difference.
// cpu-ns/op is this process's CPU time per cycle.
func BenchmarkSerial(b *testing.B) {
	rdb := redistest.Shared(b)
	c := shared(b)
	ctx := context.Background()
	b.Run("onceguard", func(b *testing.B) {
		l := lock.New(rueidislock.New(c, &rueidislock.Options{Prefix: redistest.Prefix(b, rdb, "ogbench-serial")}), nil)
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
	b.Run("minimal", func(b *testing.B) {
		key := redistest.Prefix(b, rdb, "ogbench-serial-minimal") + "k"
		release := rueidis.NewLuaScript(minimalRelease)
		keys := []string{key}
		b.ReportAllocs()
		cpu0 := cpuNow(b)
		var n int64
		for b.Loop() {
			n++
			tok := strconv.FormatInt(n, 10)
			if err := c.Do(ctx, c.B().Set().Key(key).Value(tok).Nx().PxMilliseconds(10000).Build()).Error(); err != nil {
				b.Fatal(err)
			}
			if v, err := release.Exec(ctx, c, keys, []string{tok}).AsInt64(); err != nil || v != 1 {
				b.Fatal(v, err)
			}
		}
		b.ReportMetric(float64(cpuNow(b)-cpu0)/float64(b.N), "cpu-ns/op")
	})
}

// BenchmarkSerialFenceCost is the minimal design with a fence, the part
// of onceguard's cycle that no implementation can skip: INCR of a counter
// sent with the SET, in the same round trip. Next to BenchmarkSerial's
// minimal it is what the fence alone costs at one goroutine.
func BenchmarkSerialFenceCost(b *testing.B) {
	rdb := redistest.Shared(b)
	c := shared(b)
	ctx := context.Background()
	key := redistest.Prefix(b, rdb, "ogbench-serial-fence") + "k"
	release := rueidis.NewLuaScript(minimalRelease)
	keys := []string{key}
	b.ReportAllocs()
	cpu0 := cpuNow(b)
	var n int64
	for b.Loop() {
		n++
		tok := strconv.FormatInt(n, 10)
		res := c.DoMulti(ctx, c.B().Set().Key(key).Value(tok).Nx().PxMilliseconds(10000).Build(), c.B().Incr().Key(key+":fence").Build())
		if err := res[0].Error(); err != nil {
			b.Fatal(err)
		}
		if _, err := res[1].AsInt64(); err != nil {
			b.Fatal(err)
		}
		if v, err := release.Exec(ctx, c, keys, []string{tok}).AsInt64(); err != nil || v != 1 {
			b.Fatal(v, err)
		}
	}
	b.ReportMetric(float64(cpuNow(b)-cpu0)/float64(b.N), "cpu-ns/op")
}

func cpuNow(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
