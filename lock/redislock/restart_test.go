package redislock_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/onceguard/onceguard/lock"
	"github.com/onceguard/onceguard/lock/redislock"
)

// A release or refresh right after Redis restarted (its data lost)
// answers what Redis now knows: the lock is not held (ErrExpired), never
// a broken connection's EOF (go-redis checks a pooled connection before
// it sends on it, even with retries off, as here). rueidislock has the
// same test.
func TestOwnerCallsAfterRestart(t *testing.T) {
	srv, c := ownRedis(t)
	l := redislock.New(c, nil)
	ctx := context.Background()
	for i := range 8 {
		a, err := l.TryAcquire(ctx, "r", time.Minute)
		for try := 0; err != nil && try < 50; try++ { // the client reconnects on its own
			time.Sleep(100 * time.Millisecond)
			a, err = l.TryAcquire(ctx, "r", time.Minute)
		}
		if err != nil {
			t.Fatalf("round %d: TryAcquire = %v", i, err)
		}
		b, err := l.TryAcquire(ctx, "s", time.Minute)
		if err != nil {
			t.Fatalf("round %d: TryAcquire = %v", i, err)
		}
		srv.Restart(t)
		if err := a.Release(ctx); !errors.Is(err, lock.ErrExpired) {
			t.Errorf("round %d: Release after the restart = %v; want ErrExpired", i, err)
		}
		if err := b.Refresh(ctx, time.Minute); !errors.Is(err, lock.ErrExpired) {
			t.Errorf("round %d: Refresh after the restart = %v; want ErrExpired", i, err)
		}
	}
}
