package rueidislock_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/onceguard/onceguard/lock"
	"github.com/onceguard/onceguard/lock/rueidislock"
)

// A release or refresh right after Redis restarted (its data lost) meets
// a connection the restart broke. Both compare by owner, so they are sent
// again on a new connection, and answer what Redis now knows: the lock is
// not held (ErrExpired), never the broken connection's EOF.
func TestOwnerCallsAfterRestart(t *testing.T) {
	srv, c := ownRedis(t)
	l := rueidislock.New(c, nil)
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
