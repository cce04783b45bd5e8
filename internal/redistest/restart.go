package redistest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/onceguard/onceguard/lock"
)

// OwnerCallsAfterRestart checks, for a Locker on a backend of srv, that
// a release or refresh right after Redis restarted (its data lost)
// answers what Redis now knows, that the lock is not held (ErrExpired),
// never the EOF of a connection the restart broke: both compare by owner,
// so a backend may send them again on a new connection.
func OwnerCallsAfterRestart(t *testing.T, srv *Server, l *lock.Locker) {
	t.Helper()
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
