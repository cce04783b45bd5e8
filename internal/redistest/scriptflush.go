package redistest

import (
	"context"
	"testing"
	"time"

	"github.com/onceguard/onceguard/lock"
)

// ScriptFlushPaths checks PITFALLS 6 (NOSCRIPT after a restart, a
// failover or SCRIPT FLUSH) on the script paths a try and a release do
// not take: a refresh, a blocking acquire, and a waiter's handover. flush
// empties the server's script cache; each call runs right after one.
// MaxBackoff is 30 s, so a waiter that got the lock was handed it, not
// polling.
func ScriptFlushPaths(t *testing.T, b lock.Backend, flush func() error) {
	t.Helper()
	l := lock.New(b, &lock.Options{MaxBackoff: 30 * time.Second})
	ctx := context.Background()
	mustFlush := func() {
		t.Helper()
		if err := flush(); err != nil {
			t.Fatalf("SCRIPT FLUSH = %v", err)
		}
	}
	lease, err := l.TryAcquire(ctx, "flush/refresh", time.Second)
	if err != nil {
		t.Fatalf("TryAcquire = %v", err)
	}
	mustFlush()
	if err := lease.Refresh(ctx, 2*time.Second); err != nil {
		t.Errorf("Refresh after SCRIPT FLUSH = %v; want nil", err)
	}
	if err := lease.Release(ctx); err != nil {
		t.Errorf("Release = %v", err)
	}

	mustFlush()
	lease, err = l.Acquire(ctx, "flush/blocking", time.Second)
	if err != nil {
		t.Fatalf("Acquire (free) after SCRIPT FLUSH = %v; want a lease", err)
	}
	if err := lease.Release(ctx); err != nil {
		t.Errorf("Release = %v", err)
	}

	held, err := l.TryAcquire(ctx, "flush/handover", time.Minute)
	if err != nil {
		t.Fatalf("TryAcquire = %v", err)
	}
	got := make(chan *lock.Lease, 1)
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	go func() {
		if err := flush(); err != nil { // the blocked acquire's script, too, finds the cache empty
			t.Errorf("SCRIPT FLUSH = %v", err)
		}
		w, err := l.Acquire(wctx, "flush/handover", time.Second)
		if err != nil {
			t.Errorf("blocked Acquire after SCRIPT FLUSH = %v; want the lock once released", err)
		}
		got <- w
	}()
	time.Sleep(300 * time.Millisecond) // the waiter queued
	mustFlush()
	start := time.Now()
	if err := held.Release(ctx); err != nil {
		t.Errorf("Release with a waiter after SCRIPT FLUSH = %v; want nil", err)
	}
	if w := <-got; w != nil {
		if took := time.Since(start); took > 5*time.Second {
			t.Errorf("the waiter got the lock %v after the release; want it handed over, not polled", took)
		}
		if w.Fence() <= held.Fence() {
			t.Errorf("waiter's fence %d; want > %d", w.Fence(), held.Fence())
		}
		_ = w.Release(ctx)
	}
}
