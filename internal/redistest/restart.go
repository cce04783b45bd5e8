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
	// An acquire is not sent again on a broken connection (its SET may
	// have taken effect), so right after a restart it can fail with the
	// connection; the client reconnects on its own, and the test retries.
	acquire := func(round int, key string) *lock.Lease {
		t.Helper()
		lease, err := l.TryAcquire(ctx, key, time.Minute)
		for try := 0; err != nil && try < 50; try++ {
			time.Sleep(100 * time.Millisecond)
			lease, err = l.TryAcquire(ctx, key, time.Minute)
		}
		if err != nil {
			t.Fatalf("round %d: TryAcquire(%s) = %v", round, key, err)
		}
		return lease
	}
	for i := range 8 {
		a, b := acquire(i, "r"), acquire(i, "s")
		srv.Restart(t)
		if err := a.Release(ctx); !errors.Is(err, lock.ErrExpired) {
			t.Errorf("round %d: Release after the restart = %v; want ErrExpired", i, err)
		}
		if err := b.Refresh(ctx, time.Minute); !errors.Is(err, lock.ErrExpired) {
			t.Errorf("round %d: Refresh after the restart = %v; want ErrExpired", i, err)
		}
	}
}
