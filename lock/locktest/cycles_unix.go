//go:build unix

package locktest

import (
	"context"
	"fmt"
	"runtime"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/onceguard/onceguard/lock"
)

// Cycles benchmarks l with lock cycles (TryAcquire, then Release) from 64
// goroutines, each on a key of its own: the bench's distinct-64 cell
// without its harness. Besides ns/op and allocs/op it reports cpu-ns/op,
// this process's CPU time (user + system) per cycle, the client's cost,
// which on a small shared machine is steadier than ns/op. Keys are k1 ...
// k64: give l a prefix of its own.
func Cycles(b *testing.B, l *lock.Locker) {
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
}

// processCPU returns the CPU time this process used so far.
func processCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
