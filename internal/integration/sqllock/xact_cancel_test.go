package sqllock_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/onceguard/onceguard/internal/dbtest"
	"github.com/onceguard/onceguard/internal/faultproxy"
	"github.com/onceguard/onceguard/lock"
	"github.com/onceguard/onceguard/lock/sqllock"
)

// slowXact opens an XactBackend on PostgreSQL through a proxy that can
// slow it down.
func slowXact(t *testing.T) (*sqllock.XactBackend, *faultproxy.Proxy) {
	dsn := os.Getenv("ONCEGUARD_TEST_POSTGRES")
	if dsn == "" {
		t.Skip("ONCEGUARD_TEST_POSTGRES not set; skipping the integration test")
	}
	dsn, p := faultproxy.Front(t, dsn)
	b, err := sqllock.NewXact(dbtest.OpenPostgres(t, dsn))
	if err != nil {
		t.Fatal(err)
	}
	return b, p
}

// A caller's Refresh cancelled while its statement is on its way leaves the
// lock held: the cancellation must not break the connection under the
// lease's transaction, which would free the lock.
func TestXactCancelledRefreshKeepsLock(t *testing.T) {
	b, p := slowXact(t)
	l := lock.New(b, nil)
	key := "xact-cancelled-refresh-" + time.Now().Format(time.RFC3339Nano)
	lease, err := l.TryAcquire(t.Context(), key, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	p.SetLatency(200 * time.Millisecond)
	ctx, cancel := context.WithCancel(t.Context())
	time.AfterFunc(50*time.Millisecond, cancel)
	if err := lease.Refresh(ctx, 10*time.Second); err != nil {
		t.Logf("Refresh with its context cancelled on the way = %v", err)
	}
	p.SetLatency(0)
	if other, err := l.TryAcquire(t.Context(), key, time.Second); err == nil {
		_ = other.Release(t.Context())
		t.Fatal("another owner took the lock after a cancelled Refresh; want it still held")
	}
	if err := lease.Release(t.Context()); err != nil {
		t.Errorf("Release = %v; want nil, the lease held", err)
	}
}

// signalRefresh tells when a Refresh reaches the backend.
type signalRefresh struct {
	lock.Backend
	began chan struct{}
}

func (s *signalRefresh) Refresh(ctx context.Context, key, owner string, ttl time.Duration) error {
	select {
	case s.began <- struct{}{}:
	default:
	}
	return s.Backend.Refresh(ctx, key, owner, ttl)
}

// An auto-renewed lease released while its renewal's statement is on its
// way is released, not lost: the renewal is cancelled only after the
// release, so it cannot break the session holding the lock under it.
func TestXactReleaseDuringRenewal(t *testing.T) {
	xb, p := slowXact(t)
	b := &signalRefresh{Backend: xb, began: make(chan struct{}, 1)}
	var lost atomic.Int32
	l := lock.New(b, &lock.Options{AutoRenew: true, Observe: func(e lock.Event) {
		if e.Op == lock.OpLost {
			lost.Add(1)
		}
	}})
	key := "xact-release-renewing-" + time.Now().Format(time.RFC3339Nano)
	lease, err := l.TryAcquire(t.Context(), key, 6*time.Second) // the renewal at 2s
	if err != nil {
		t.Fatal(err)
	}
	p.SetLatency(200 * time.Millisecond)
	select {
	case <-b.began:
	case <-time.After(10 * time.Second):
		t.Fatal("no renewal 10s after the acquire; want one after TTL/3")
	}
	time.Sleep(50 * time.Millisecond) // the renewal's statement is on its way
	if err := lease.Release(context.Background()); err != nil {
		t.Errorf("Release = %v; want nil, the lease held until Release", err)
	}
	p.SetLatency(0)
	if n := lost.Load(); n > 0 {
		t.Errorf("%d OpLost for a lease held until Release", n)
	}
	if err := lease.Err(); err != nil {
		t.Errorf("Err after Release = %v; want nil", err)
	}
}

// A caller's Refresh whose deadline ends its statement on the way breaks
// the session holding the lock: Refresh says the lock is gone and the
// lease ends, rather than a transient error with the lease believing it
// still holds a lock another owner can take.
func TestXactRefreshDeadlineEndsLease(t *testing.T) {
	b, p := slowXact(t)
	l := lock.New(b, nil)
	key := "xact-refresh-deadline-" + time.Now().Format(time.RFC3339Nano)
	lease, err := l.TryAcquire(t.Context(), key, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	p.SetLatency(200 * time.Millisecond)
	ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
	err = lease.Refresh(ctx, 10*time.Second)
	cancel()
	p.SetLatency(0)
	if !errors.Is(err, lock.ErrNotHeld) {
		t.Errorf("Refresh whose deadline ended its statement = %v; want ErrExpired or ErrNotHeld (the session is gone)", err)
	}
	if err := lease.Err(); !errors.Is(err, lock.ErrLost) {
		t.Errorf("lease Err = %v; want ErrLost", err)
	}
	other, err := l.TryAcquire(t.Context(), key, time.Second)
	if err != nil {
		t.Fatalf("TryAcquire after the session ended = %v; want the lock free", err)
	}
	_ = other.Release(t.Context())
}

// A caller's Refresh cancelled, without a deadline, on a connection that
// stopped answering returns when the server would have ended the idle
// session anyway (the lease's TTL), saying the lock is gone, not when the
// network comes back.
func TestXactCancelledRefreshBoundedByTTL(t *testing.T) {
	b, p := slowXact(t)
	l := lock.New(b, nil)
	key := "xact-refresh-blackhole-" + time.Now().Format(time.RFC3339Nano)
	const ttl = time.Second
	lease, err := l.TryAcquire(t.Context(), key, ttl)
	if err != nil {
		t.Fatal(err)
	}
	p.Blackhole()
	ctx, cancel := context.WithCancel(t.Context())
	time.AfterFunc(100*time.Millisecond, cancel)
	start := time.Now()
	refreshed := make(chan error, 1)
	go func() { refreshed <- lease.Refresh(ctx, ttl) }()
	select {
	case err := <-refreshed:
		if !errors.Is(err, lock.ErrNotHeld) {
			t.Errorf("Refresh on a silent connection = %v; want ErrExpired (the session's TTL passed)", err)
		}
	case <-time.After(ttl + 5*time.Second):
		t.Errorf("Refresh still blocked %v after it began on a silent connection; want it back by the TTL (%v) and the probe", time.Since(start), ttl)
		_ = p.Heal()
		<-refreshed // before the proxy closes
	}
}

// Refreshes of one lease at once (callers' beside each other, as a
// caller's beside a renewal) take turns on the lease's connection: two
// statements interleaved on it fail ("conn busy", which broke the session
// and lost the lock) or panic inside the driver.
func TestXactConcurrentRefreshes(t *testing.T) {
	b, _ := slowXact(t)
	l := lock.New(b, nil)
	key := "xact-concurrent-refreshes-" + time.Now().Format(time.RFC3339Nano)
	lease, err := l.TryAcquire(t.Context(), key, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var failed atomic.Int32
	for range 4 {
		wg.Go(func() {
			for range 25 {
				if err := lease.Refresh(t.Context(), 5*time.Second); err != nil {
					if failed.Add(1) == 1 {
						t.Errorf("Refresh beside others = %v; want nil", err)
					}
					return
				}
			}
		})
	}
	wg.Wait()
	if err := lease.Err(); err != nil {
		t.Errorf("lease Err after concurrent Refreshes = %v; want nil", err)
	}
	if other, err := l.TryAcquire(t.Context(), key, time.Second); err == nil {
		_ = other.Release(t.Context())
		t.Fatal("another owner took the lock; want it still held")
	}
	if err := lease.Release(t.Context()); err != nil {
		t.Errorf("Release = %v; want nil", err)
	}
}

// A caller's Refresh without a deadline, sent while a renewal's statement
// is on its way, runs after it and is bounded by the TTL the renewal
// set, not by the one before: cut at the old bound, it broke a live
// session.
func TestXactRefreshBehindRenewal(t *testing.T) {
	xb, p := slowXact(t)
	b := &signalRefresh{Backend: xb, began: make(chan struct{}, 1)}
	l := lock.New(b, &lock.Options{AutoRenew: true})
	key := "xact-refresh-behind-renewal-" + time.Now().Format(time.RFC3339Nano)
	// The renewal at about 433 ms is answered at about 933; the caller's
	// Refresh behind it at about 1433, past the bound before the renewal
	// (about 1300) and well inside the one after (about 1718).
	const ttl = 1300 * time.Millisecond
	lease, err := l.TryAcquire(t.Context(), key, ttl)
	if err != nil {
		t.Fatal(err)
	}
	if err := lease.Refresh(t.Context(), ttl); err != nil { // prepares the statement on the connection
		t.Fatal(err)
	}
	<-b.began                            // that Refresh's signal
	p.SetLatency(250 * time.Millisecond) // a round trip of 500 ms
	select {
	case <-b.began: // the renewal
	case <-time.After(10 * time.Second):
		t.Fatal("no renewal 10s after the acquire; want one after TTL/3")
	}
	err = lease.Refresh(context.Background(), ttl) // behind it
	p.SetLatency(0)
	if err != nil {
		t.Errorf("a caller's Refresh behind a renewal that succeeded = %v; want nil", err)
	}
	if other, err := l.TryAcquire(t.Context(), key, time.Second); err == nil {
		t.Errorf("another owner took the lock (fence %d): the lease's session was broken", other.Fence())
		_ = other.Release(t.Context())
	}
	_ = lease.Release(t.Context())
}

// A caller's Refresh whose context's deadline has already passed sends
// nothing (database/sql refuses a statement on a done context), so it must
// not end the lease's transaction and free the lock, whichever way the
// wait for the turn (free, beside a context already done) goes.
func TestXactRefreshPastDeadline(t *testing.T) {
	b, _ := slowXact(t)
	l := lock.New(b, nil)
	const n = 20
	freed := 0
	var sample error
	for i := range n {
		key := fmt.Sprintf("xact-past-deadline-%d-%s", i, time.Now().Format(time.RFC3339Nano))
		lease, err := l.TryAcquire(t.Context(), key, 10*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
		rerr := lease.Refresh(ctx, 10*time.Second)
		cancel()
		if other, err := l.TryAcquire(t.Context(), key, time.Second); err == nil {
			freed++
			sample = rerr
			_ = other.Release(t.Context())
		}
		_ = lease.Release(t.Context())
	}
	if freed > 0 {
		t.Errorf("%d of %d Refreshes on an already expired context freed the lock (e.g. Refresh = %v); want 0: nothing was sent", freed, n, sample)
	}
}
