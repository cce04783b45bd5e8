package redistest

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/onceguard/onceguard/lock"
)

// UnseededFence checks a Redis lock backend's reseed rule: l's lock "k",
// whose fence record on rdb's server is fenceKey, is taken over a fence
// record left unseeded (set to 1, as a failed reseed after its creation
// leaves it, then to 41, some tries later), and must get a fence of at
// least the server's clock in µs, with the record given its expiry.
func UnseededFence(t *testing.T, rdb *redis.Client, l *lock.Locker, fenceKey string) {
	t.Helper()
	ctx := context.Background()
	for _, left := range []int64{1, 41} {
		if err := rdb.Set(ctx, fenceKey, left, 0).Err(); err != nil {
			t.Fatal(err)
		}
		now, err := rdb.Time(ctx).Result()
		if err != nil {
			t.Fatal(err)
		}
		lease, err := l.TryAcquire(ctx, "k", time.Second)
		if err != nil {
			t.Fatalf("TryAcquire = %v", err)
		}
		if lease.Fence() < now.UnixMicro() {
			t.Errorf("fence over an unseeded record at %d = %d; want at least the server's clock, %d µs", left, lease.Fence(), now.UnixMicro())
		}
		if ttl := rdb.PTTL(ctx, fenceKey).Val(); ttl <= 0 {
			t.Errorf("the reseeded fence record's PTTL = %v; want its retention", ttl)
		}
		if err := lease.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
}
