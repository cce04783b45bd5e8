package lock_test

import (
	"context"
	"testing"
	"time"

	"github.com/onceguard/onceguard/lock"
)

// nopBackend grants every acquire and release at once: what is left of a
// cycle is the Locker's and the Lease's own work.
type nopBackend struct{}

func (nopBackend) Acquire(context.Context, lock.Request) (lock.Grant, error) {
	return lock.Grant{Fence: 1}, nil
}
func (nopBackend) Release(context.Context, string, string) error { return nil }
func (nopBackend) Refresh(context.Context, string, string, time.Duration) error {
	return nil
}

// BenchmarkLockerOverhead is one TryAcquire + Release on a backend that
// does nothing: the time and allocations the Locker adds to every lock
// cycle of every backend.
func BenchmarkLockerOverhead(b *testing.B) { lockerOverhead(b, nil) }

// BenchmarkLockerOverheadAutoRenew is BenchmarkLockerOverhead with
// Options.AutoRenew: what renewal adds to a lease released before its
// first renewal (a timer set and stopped).
func BenchmarkLockerOverheadAutoRenew(b *testing.B) {
	lockerOverhead(b, &lock.Options{AutoRenew: true})
}

func lockerOverhead(b *testing.B, opts *lock.Options) {
	l := lock.New(nopBackend{}, opts)
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		ls, err := l.TryAcquire(ctx, "bench-key", 10*time.Second)
		if err != nil {
			b.Fatal(err)
		}
		if err := ls.Release(ctx); err != nil {
			b.Fatal(err)
		}
	}
}
