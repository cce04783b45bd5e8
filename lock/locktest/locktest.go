// Package locktest is the conformance suite every lock.Backend runs. A new
// backend proves itself by calling Run from its tests:
//
//	func TestConformance(t *testing.T) {
//		locktest.Run(t, func(t *testing.T) lock.Backend { return newBackend(t) })
//	}
//
// Keys are unique per run, so several runs may share one server. The suite
// checks mutual exclusion under 100 goroutines, TTL expiry, that refresh and
// release fail once the lease is gone (with ErrExpired or ErrNotHeld), that
// fencing tokens strictly increase across holders, that the lost-lease
// signal fires, that a blocking wait honours its context and leaves no
// trace, that release wakes a waiter long before the TTL (also when the
// release comes between the waiter's failed attempt and its subscription),
// bad input, and that no goroutine is left behind.
package locktest

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/onceguard/onceguard/internal/leakcheck"
	"github.com/onceguard/onceguard/lock"
)

// Run runs the suite. newBackend is called once per subtest. After each
// subtest no goroutine may be left that was not running before it; ignore
// names functions of goroutines the backend's client legitimately starts on
// the way (for example a SQL driver's per-connection watcher, when the pool grows).
func Run(t *testing.T, newBackend func(t *testing.T) lock.Backend, ignore ...string) {
	run := func(name string, f func(t *testing.T, b lock.Backend, key string)) {
		t.Run(name, func(t *testing.T) {
			b := newBackend(t)
			opts := []leakcheck.Option{leakcheck.IgnoreCurrent()}
			for _, f := range ignore {
				opts = append(opts, leakcheck.IgnoreAnyFunction(f))
			}
			f(t, b, fmt.Sprintf("locktest/%s/%d", t.Name(), time.Now().UnixNano()))
			leakcheck.VerifyNone(t, opts...)
		})
	}
	run("MutualExclusion", testMutualExclusion)
	run("TryAcquireWhileHeld", testTryAcquireWhileHeld)
	run("TTLExpiry", testTTLExpiry)
	run("RefreshAfterExpiry", testRefreshAfterExpiry)
	run("ReleaseByNonOwner", testReleaseByNonOwner)
	run("FencesIncrease", testFencesIncrease)
	run("LostSignalOnExpiry", testLostSignalOnExpiry)
	run("AutoRenew", testAutoRenew)
	run("AutoRenewLoss", testAutoRenewLoss)
	run("AutoRenewTransient", testAutoRenewTransient)
	run("BlockingWaitDeadline", testBlockingWaitDeadline)
	run("ReleaseWakesWaiter", testReleaseWakesWaiter)
	run("ReleaseBeforeSubscribe", testReleaseBeforeSubscribe)
	run("LostWakeUp", testLostWakeUp)
	run("ReleaseWithCancelledContext", testReleaseCancelled)
	run("DoubleRelease", testDoubleRelease)
	run("BadInput", testBadInput)
	run("Do", testDo)
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func mustTry(t *testing.T, l *lock.Locker, key string, ttl time.Duration) *lock.Lease {
	t.Helper()
	lease, err := l.TryAcquire(ctxT(t), key, ttl)
	if err != nil {
		t.Fatalf("TryAcquire(%q) = %v; want a lease", key, err)
	}
	return lease
}

func mustRelease(t *testing.T, lease *lock.Lease) {
	t.Helper()
	if err := lease.Release(ctxT(t)); err != nil {
		t.Fatalf("Release(%q) = %v; want nil", lease.Key(), err)
	}
}

func testMutualExclusion(t *testing.T, b lock.Backend, key string) {
	l := lock.New(b, nil)
	const workers = 100
	var (
		inside    atomic.Int32
		mu        sync.Mutex
		lastFence int64
		count     int
		wg        sync.WaitGroup
		errs      = make(chan error, workers)
	)
	ctx := ctxT(t)
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			lease, err := l.Acquire(ctx, key, 10*time.Second)
			if err != nil {
				errs <- fmt.Errorf("Acquire = %v; want a lease", err)
				return
			}
			if n := inside.Add(1); n != 1 {
				errs <- fmt.Errorf("%d holders inside the critical section; want 1", n)
			}
			mu.Lock()
			if lease.Fence() <= lastFence {
				errs <- fmt.Errorf("fence %d after %d; want strictly increasing", lease.Fence(), lastFence)
			}
			lastFence = lease.Fence()
			count++
			mu.Unlock()
			time.Sleep(100 * time.Microsecond)
			inside.Add(-1)
			if err := lease.Release(ctx); err != nil {
				errs <- fmt.Errorf("Release = %v; want nil", err)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if count != workers {
		t.Errorf("%d goroutines got the lock; want %d", count, workers)
	}
}

func testTryAcquireWhileHeld(t *testing.T, b lock.Backend, key string) {
	l := lock.New(b, nil)
	lease := mustTry(t, l, key, 10*time.Second)
	_, err := l.TryAcquire(ctxT(t), key, time.Second)
	if !errors.Is(err, lock.ErrNotAcquired) {
		t.Errorf("TryAcquire while held = %v; want ErrNotAcquired", err)
	}
	other := mustTry(t, l, key+"/other", time.Second) // other keys are independent
	mustRelease(t, other)
	mustRelease(t, lease)
	mustRelease(t, mustTry(t, l, key, time.Second))
}

func testTTLExpiry(t *testing.T, b lock.Backend, key string) {
	l := lock.New(b, nil)
	first := mustTry(t, l, key, 100*time.Millisecond)
	time.Sleep(250 * time.Millisecond)
	second := mustTry(t, l, key, 10*time.Second)
	if second.Fence() <= first.Fence() {
		t.Errorf("fence after expiry = %d; want > %d", second.Fence(), first.Fence())
	}
	mustRelease(t, second)
}

func testRefreshAfterExpiry(t *testing.T, b lock.Backend, key string) {
	l := lock.New(b, nil)
	// Acquired with a long TTL: the refresh while held must not race the
	// lease's local deadline. Under load (-race, two cores, every package
	// at once) an acquire and a refresh took over 100ms, and the lease had
	// run out before the refresh while held came back. Only the refresh
	// to 200ms decides when the lease ends.
	lease := mustTry(t, l, key, 10*time.Second)
	if err := lease.Refresh(ctxT(t), 200*time.Millisecond); err != nil {
		t.Fatalf("Refresh while held = %v; want nil", err)
	}
	time.Sleep(350 * time.Millisecond)
	if err := lease.Refresh(ctxT(t), time.Second); !errors.Is(err, lock.ErrExpired) {
		t.Errorf("Refresh after expiry = %v; want ErrExpired", err)
	}
	// The failed refresh must not have revived the lock.
	mustRelease(t, mustTry(t, l, key, time.Second))
}

func testReleaseByNonOwner(t *testing.T, b lock.Backend, key string) {
	l := lock.New(b, nil)
	stale := mustTry(t, l, key, 100*time.Millisecond)
	time.Sleep(250 * time.Millisecond)
	current := mustTry(t, l, key, 10*time.Second)
	err := stale.Release(ctxT(t))
	if !errors.Is(err, lock.ErrNotHeld) || errors.Is(err, lock.ErrExpired) {
		t.Errorf("Release by the old owner = %v; want ErrNotHeld (another owner), not ErrExpired", err)
	}
	if err := stale.Refresh(ctxT(t), time.Second); !errors.Is(err, lock.ErrNotHeld) {
		t.Errorf("Refresh by the old owner = %v; want ErrNotHeld", err)
	}
	if _, err := l.TryAcquire(ctxT(t), key, time.Second); !errors.Is(err, lock.ErrNotAcquired) {
		t.Errorf("TryAcquire after a non-owner release = %v; want ErrNotAcquired (the lock must still be held)", err)
	}
	if current.Err() != nil {
		t.Errorf("current holder's lease Err = %v; want nil", current.Err())
	}
	mustRelease(t, current)
}

func testFencesIncrease(t *testing.T, b lock.Backend, key string) {
	l1, l2 := lock.New(b, nil), lock.New(b, nil)
	var last int64
	for i := range 20 {
		l := l1
		if i%2 == 1 {
			l = l2
		}
		lease := mustTry(t, l, key, time.Second)
		if lease.Fence() <= last {
			t.Fatalf("acquire %d: fence %d; want > %d", i, lease.Fence(), last)
		}
		last = lease.Fence()
		mustRelease(t, lease)
	}
}

func testLostSignalOnExpiry(t *testing.T, b lock.Backend, key string) {
	l := lock.New(b, nil)
	lease := mustTry(t, l, key, 100*time.Millisecond)
	select {
	case <-lease.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("Done not closed 10s after a 100ms lease; want closed at its TTL")
	}
	if err := lease.Err(); !errors.Is(err, lock.ErrLost) || !errors.Is(err, lock.ErrExpired) {
		t.Errorf("Err after expiry = %v; want ErrLost and ErrExpired", err)
	}
	if err := context.Cause(lease.Context()); !errors.Is(err, lock.ErrLost) {
		t.Errorf("context cause = %v; want ErrLost", err)
	}
	// Past the TTL on the backend too: Done fires a drift margin early, and
	// the backend counts from when the acquire arrived.
	time.Sleep(200 * time.Millisecond)
	if err := lease.Release(ctxT(t)); !errors.Is(err, lock.ErrExpired) {
		t.Errorf("Release after expiry = %v; want ErrExpired", err)
	}
}

func testAutoRenew(t *testing.T, b lock.Backend, key string) {
	l := lock.New(b, &lock.Options{AutoRenew: true})
	// A TTL long enough that a renewal (every TTL/3) survives a stall of
	// over half a second: CI runs every package at once, with -race, on
	// two cores, and on a machine shared with other work (load average
	// 20-30) a 400ms TTL expired on the SQLite backend between renewals.
	lease := mustTry(t, l, key, time.Second)
	time.Sleep(3 * time.Second) // three TTLs: without renewal it ends after one
	select {
	case <-lease.Done():
		t.Fatalf("renewed lease ended: %v; want held", lease.Err())
	default:
	}
	if _, err := l.TryAcquire(ctxT(t), key, time.Second); !errors.Is(err, lock.ErrNotAcquired) {
		t.Errorf("TryAcquire of a renewed lock = %v; want ErrNotAcquired", err)
	}
	mustRelease(t, lease)
	if err := lease.Err(); err != nil {
		t.Errorf("Err after Release = %v; want nil", err)
	}
	if cause := context.Cause(lease.Context()); !errors.Is(cause, lock.ErrReleased) {
		t.Errorf("cause after Release = %v; want ErrReleased", cause)
	}
}

// stealing wraps a backend and makes Refresh report the lock as taken.
type stealing struct {
	lock.Backend
	stolen atomic.Bool
}

func (s *stealing) Refresh(ctx context.Context, key, owner string, ttl time.Duration) error {
	if s.stolen.Load() {
		return fmt.Errorf("refresh %q: %w", key, lock.ErrNotHeld)
	}
	return s.Backend.Refresh(ctx, key, owner, ttl)
}

// Renewal that finds the lock held by another owner (ErrNotHeld proper,
// not ErrExpired) ends the lease at once: the loss is not a transient error
// to retry until the local deadline (pitfall 10). The cause tells the two
// apart deterministically: a lease that only ran out locally ends with
// ErrExpired, a lease that renewal found taken with ErrNotHeld alone.
func testAutoRenewLoss(t *testing.T, b lock.Backend, key string) {
	s := &stealing{Backend: b}
	l := lock.New(s, &lock.Options{AutoRenew: true})
	const ttl = 1500 * time.Millisecond // renewed every 500ms
	lease := mustTry(t, l, key, ttl)
	s.stolen.Store(true)
	stolen := time.Now()
	select {
	case <-lease.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("Done not closed 10s after renewal found the lock gone; want closed at the next renewal")
	}
	// Generous: the next renewal is due within TTL/3 of the theft; only a
	// lease that ignored the loss and lived on (refreshing nothing) would
	// get near two TTLs.
	if d := time.Since(stolen); d >= 2*ttl {
		t.Errorf("Done closed %v after the lock was taken; want before %v (at the next renewal, not the lease's deadline or later)", d, 2*ttl)
	}
	err := lease.Err()
	if !errors.Is(err, lock.ErrLost) || !errors.Is(err, lock.ErrNotHeld) {
		t.Errorf("Err = %v; want ErrLost and ErrNotHeld", err)
	}
	if errors.Is(err, lock.ErrExpired) {
		t.Errorf("Err = %v; want the renewal's ErrNotHeld (another owner holds the lock), not ErrExpired: "+
			"the lease ran out at its local deadline, so renewal treated the loss as transient", err)
	}
	if cause := context.Cause(lease.Context()); !errors.Is(cause, lock.ErrNotHeld) || errors.Is(cause, lock.ErrExpired) {
		t.Errorf("context cause = %v; want ErrNotHeld from renewal, not ErrExpired", cause)
	}
	if err := lease.Refresh(ctxT(t), ttl); !errors.Is(err, lock.ErrNotHeld) {
		t.Errorf("Refresh of the lost lease = %v; want ErrNotHeld (a lost lease is never revived)", err)
	}
	s.stolen.Store(false)
	if err := lease.Release(ctxT(t)); err != nil {
		t.Errorf("Release of the (really still held) lock = %v; want nil", err)
	}
}

// flaky wraps a backend and makes Refresh fail as if the backend were
// unreachable. It counts the refreshes it refused and those that reached
// the backend and succeeded, and knows how many are on their way there.
type flaky struct {
	lock.Backend
	mu        sync.Mutex
	changed   *sync.Cond // on mu: broadcast as a refresh is refused or comes back
	down      bool
	refused   int
	refreshed int
	inFlight  int
}

func newFlaky(b lock.Backend) *flaky {
	f := &flaky{Backend: b}
	f.changed = sync.NewCond(&f.mu)
	return f
}

func (f *flaky) Refresh(ctx context.Context, key, owner string, ttl time.Duration) error {
	f.mu.Lock()
	if f.down {
		f.refused++
		f.changed.Broadcast()
		f.mu.Unlock()
		return fmt.Errorf("refresh %q: %w", key, lock.ErrUnavailable)
	}
	f.inFlight++
	f.mu.Unlock()
	err := f.Backend.Refresh(ctx, key, owner, ttl)
	f.mu.Lock()
	f.inFlight--
	if err == nil {
		f.refreshed++
	}
	f.changed.Broadcast()
	f.mu.Unlock()
	return err
}

func (f *flaky) setDown(down bool) {
	f.mu.Lock()
	f.down = down
	f.mu.Unlock()
}

// await waits until cond (called with f.mu held) holds, or fails t after
// a time that only bounds a hang.
func (f *flaky) await(t *testing.T, what string, cond func() bool) {
	t.Helper()
	stop := time.AfterFunc(30*time.Second, func() {
		f.mu.Lock()
		f.changed.Broadcast()
		f.mu.Unlock()
	})
	defer stop.Stop()
	deadline := time.Now().Add(30 * time.Second)
	f.mu.Lock()
	defer f.mu.Unlock()
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not %s within 30s", what)
		}
		f.changed.Wait()
	}
}

// Renewal retries transient errors until the lease's deadline: a short
// outage costs nothing, a long one ends the lease at its deadline.
//
// The outage and the recovery are events, not sleeps: the outage lasts
// until renewal has been refused twice (it failed and retried), and the
// recovery until a renewal has reached the backend again. The TTL leaves
// renewal about a second of slack: under load (-race, two cores, every
// package at once) a 600ms lease was lost before its retry landed.
func testAutoRenewTransient(t *testing.T, b lock.Backend, key string) {
	f := newFlaky(b)
	l := lock.New(f, &lock.Options{AutoRenew: true})
	const ttl = 1500 * time.Millisecond // renewed every 500ms
	lease := mustTry(t, l, key, ttl)
	f.setDown(true)
	f.await(t, "refused twice", func() bool { return f.refused >= 2 }) // renewals fail for a while
	f.mu.Lock()
	f.down = false
	before := f.refreshed
	f.mu.Unlock()
	f.await(t, "renewed after the outage", func() bool { return f.refreshed > before }) // renewal catches up
	if err := lease.Err(); err != nil {
		t.Fatalf("lease after a short outage: %v; want held", err)
	}
	f.setDown(true)
	select {
	case <-lease.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("lease still held 10s into an outage longer than its TTL; want ended at its deadline")
	}
	if err := lease.Err(); !errors.Is(err, lock.ErrLost) || !errors.Is(err, lock.ErrExpired) {
		t.Errorf("Err after a long outage = %v; want ErrLost and ErrExpired", err)
	}
	// Past the TTL on the backend too: it counts from when the last
	// refresh arrived, which may be later than when it was sent, even
	// after the lease's local deadline (one sent before the outage and
	// slow on its way). Once none is on its way, the last has arrived.
	f.await(t, "done with refreshes on their way", func() bool { return f.inFlight == 0 })
	f.setDown(false)
	time.Sleep(ttl)
	if err := lease.Release(ctxT(t)); !errors.Is(err, lock.ErrNotHeld) {
		t.Errorf("Release after the lease ran out = %v; want ErrNotHeld", err)
	}
}

func testBlockingWaitDeadline(t *testing.T, b lock.Backend, key string) {
	l := lock.New(b, nil)
	holder := mustTry(t, l, key, 20*time.Second)
	ctx, cancel := context.WithTimeout(ctxT(t), 150*time.Millisecond)
	defer cancel()
	lease, err := l.Acquire(ctx, key, time.Second)
	if lease != nil || !errors.Is(err, lock.ErrNotAcquired) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Acquire past its deadline = %v, %v; want nil, ErrNotAcquired joined with DeadlineExceeded", lease, err)
	}
	mustRelease(t, holder)
	// The waiter that gave up must not keep its place in line.
	mustRelease(t, mustTry(t, l, key, time.Second))

	cctx, ccancel := context.WithCancel(ctxT(t))
	ccancel()
	if _, err := l.Acquire(cctx, key, time.Second); !errors.Is(err, context.Canceled) || !errors.Is(err, lock.ErrNotAcquired) {
		t.Errorf("Acquire with a cancelled context = %v; want ErrNotAcquired and Canceled", err)
	}
	ml := lock.New(b, &lock.Options{MaxWait: 100 * time.Millisecond})
	holder = mustTry(t, l, key, 20*time.Second)
	if _, err := ml.Acquire(ctxT(t), key, time.Second); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Acquire past MaxWait = %v; want DeadlineExceeded", err)
	}
	mustRelease(t, holder)
}

func testReleaseWakesWaiter(t *testing.T, b lock.Backend, key string) {
	l := lock.New(b, nil)
	const ttl = 60 * time.Second
	holder := mustTry(t, l, key, ttl)
	got := make(chan *lock.Lease, 1)
	errc := make(chan error, 1)
	go func() {
		lease, err := l.Acquire(ctxT(t), key, time.Second)
		if err != nil {
			errc <- err
			return
		}
		got <- lease
	}()
	time.Sleep(50 * time.Millisecond) // let it start waiting
	mustRelease(t, holder)
	// Polling backends retry within MaxBackoff (250ms); the margin to the
	// TTL is what this checks: the waiter got the lock from the release,
	// not from the holder's expiry.
	select {
	case lease := <-got:
		if lease.Fence() <= holder.Fence() {
			t.Errorf("waiter's fence %d; want > %d", lease.Fence(), holder.Fence())
		}
		mustRelease(t, lease)
	case err := <-errc:
		t.Fatalf("blocked Acquire = %v; want a lease after release", err)
	case <-time.After(ttl / 2):
		t.Fatal("waiter still blocked long after release; want it woken")
	}
}

// racingWaiter wraps a backend that implements lock.Waiter. Its first Wait
// signals subscribing and, before it subscribes, waits for released: the
// holder's release lands between the waiter's failed attempt and its
// subscription, so its notification reaches nobody.
type racingWaiter struct {
	lock.Backend
	leaver
	once        sync.Once
	subscribing chan struct{} // closed by the first Wait
	released    chan struct{} // closed by the test once the holder released
}

func (r *racingWaiter) Wait(ctx context.Context, key, owner string) (<-chan struct{}, func(), error) {
	first := false
	r.once.Do(func() { first = true })
	if first {
		close(r.subscribing)
		select {
		case <-r.released:
		case <-ctx.Done():
			return nil, nil, ctx.Err()
		}
	}
	return r.waiter.Wait(ctx, key, owner)
}

// leaver is the lock.Waiter half the test wrappers pass on unchanged.
type leaver struct{ waiter lock.Waiter }

func (l leaver) Leave(ctx context.Context, key, owner string) error {
	return l.waiter.Leave(ctx, key, owner)
}

// waiterOf returns b's lock.Waiter, or skips the test: a backend without
// one has its waiters poll.
func waiterOf(t *testing.T, b lock.Backend) lock.Waiter {
	t.Helper()
	w, ok := b.(lock.Waiter)
	if !ok {
		t.Skip("backend does not implement lock.Waiter: waiters poll")
	}
	return w
}

// A release published before the waiter subscribed must not leave it asleep
// until its polling fallback (pitfall 11): the Locker subscribes first and
// then tries again, and that try finds the lock free (or handed over to it).
// MaxBackoff is 30s and the holder's TTL longer, so neither polling nor
// expiry can hide a missed wake-up within the few seconds allowed.
// Backends that do not implement lock.Waiter poll, and skip this test.
func testReleaseBeforeSubscribe(t *testing.T, b lock.Backend, key string) {
	r := &racingWaiter{Backend: b, leaver: leaver{waiterOf(t, b)}, subscribing: make(chan struct{}), released: make(chan struct{})}
	l := lock.New(r, &lock.Options{MaxBackoff: 30 * time.Second})
	holder := mustTry(t, l, key, 2*time.Minute)

	type result struct {
		lease *lock.Lease
		err   error
	}
	ctx, cancel := context.WithCancel(ctxT(t))
	res := make(chan result, 1)
	pending := true
	go func() {
		lease, err := l.Acquire(ctx, key, 10*time.Second)
		res <- result{lease, err}
	}()
	defer func() {
		// On any failure: end the wait and leave no goroutine or lock behind.
		cancel()
		if pending {
			if got := <-res; got.lease != nil {
				_ = got.lease.Release(context.Background())
			}
		}
		_ = holder.Release(context.Background())
	}()

	select {
	case <-r.subscribing:
	case got := <-res:
		pending = false
		t.Fatalf("Acquire of a held lock = %v, %v before it subscribed; want it blocked", got.lease, got.err)
	case <-time.After(10 * time.Second):
		t.Fatal("blocked Acquire never called Wait; want it to subscribe after its failed attempt")
	}
	mustRelease(t, holder) // before the waiter's subscription is in place
	released := time.Now()
	close(r.released)

	const bound = 5 * time.Second // a few round trips, generously; polling would take 15s or more
	select {
	case got := <-res:
		pending = false
		if got.err != nil {
			t.Fatalf("blocked Acquire = %v; want a lease after the release", got.err)
		}
		if got.lease.Fence() <= holder.Fence() {
			t.Errorf("waiter's fence %d; want > %d", got.lease.Fence(), holder.Fence())
		}
		mustRelease(t, got.lease)
	case <-time.After(bound):
		t.Fatalf("waiter still blocked %v after a release made between its failed attempt and its subscription; "+
			"want the attempt after subscribing to take the lock (a missed wake-up left it asleep until its 30s polling fallback)", time.Since(released).Round(time.Millisecond))
	}
}

// deafWaiter subscribes for real (the backend's queue sees the waiter)
// but hands the Locker a channel that never fires: a notification lost
// after the subscription (a dropped connection, a lost message).
type deafWaiter struct {
	lock.Backend
	leaver
}

func (d *deafWaiter) Wait(ctx context.Context, key, owner string) (<-chan struct{}, func(), error) {
	_, stop, err := d.waiter.Wait(ctx, key, owner)
	return make(chan struct{}), stop, err
}

// A wake-up lost after the subscription must not leave the waiter asleep
// until the holder's TTL (pitfall 11): it polls every MaxBackoff (here
// 300ms, jittered up to 1.5x) and takes the released lock, handed over to
// it or free. The holder's TTL is a minute, so only polling can explain
// the lock being taken within the bound.
func testLostWakeUp(t *testing.T, b lock.Backend, key string) {
	l := lock.New(&deafWaiter{Backend: b, leaver: leaver{waiterOf(t, b)}}, &lock.Options{MaxBackoff: 300 * time.Millisecond})
	holder := mustTry(t, l, key, time.Minute)
	ctx, cancel := context.WithCancel(ctxT(t))
	defer cancel()
	res := make(chan *lock.Lease, 1)
	go func() {
		lease, err := l.Acquire(ctx, key, 10*time.Second)
		if err != nil && ctx.Err() == nil {
			t.Errorf("blocked Acquire = %v; want a lease after the release", err)
		}
		res <- lease
	}()
	select {
	case lease := <-res:
		if lease != nil {
			_ = lease.Release(context.Background())
		}
		t.Fatal("Acquire of a held lock returned; want it blocked")
	case <-time.After(time.Second): // several polls of a held lock
	}
	mustRelease(t, holder)
	released := time.Now()
	const bound = 5 * time.Second // the next poll (at most 450ms) and its round trip, generously
	select {
	case lease := <-res:
		if lease == nil {
			return // reported above
		}
		if lease.Fence() <= holder.Fence() {
			t.Errorf("waiter's fence %d; want > %d", lease.Fence(), holder.Fence())
		}
		mustRelease(t, lease)
	case <-time.After(bound):
		cancel()
		if lease := <-res; lease != nil {
			_ = lease.Release(context.Background())
		}
		t.Fatalf("waiter deaf to wake-ups still blocked %v after the release; want its polling to take the lock", time.Since(released).Round(time.Millisecond))
	}
}

func testReleaseCancelled(t *testing.T, b lock.Backend, key string) {
	l := lock.New(b, nil)
	lease := mustTry(t, l, key, 20*time.Second)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := lease.Release(ctx); err != nil {
		t.Fatalf("Release with a cancelled context = %v; want nil", err)
	}
	mustRelease(t, mustTry(t, l, key, time.Second))
}

func testDoubleRelease(t *testing.T, b lock.Backend, key string) {
	l := lock.New(b, nil)
	lease := mustTry(t, l, key, 10*time.Second)
	mustRelease(t, lease)
	next := mustTry(t, l, key, 10*time.Second)
	if err := lease.Release(ctxT(t)); !errors.Is(err, lock.ErrNotHeld) {
		t.Errorf("second Release = %v; want ErrNotHeld", err)
	}
	if err := lease.Refresh(ctxT(t), time.Second); !errors.Is(err, lock.ErrNotHeld) {
		t.Errorf("Refresh after Release = %v; want ErrNotHeld", err)
	}
	// The backend itself (the Lease answered the above from its own state):
	// a release retried after a timeout, its first attempt having worked,
	// finds the next holder's lock and leaves it (PITFALLS 8).
	if err := b.Release(ctxT(t), key, lease.Token()); !errors.Is(err, lock.ErrNotHeld) {
		t.Errorf("the backend's Release, again, by the first owner = %v; want ErrNotHeld", err)
	}
	if _, err := l.TryAcquire(ctxT(t), key, 10*time.Second); !errors.Is(err, lock.ErrNotAcquired) {
		t.Errorf("TryAcquire after the retried release = %v; want ErrNotAcquired (the next holder's)", err)
	}
	if next.Err() != nil {
		t.Errorf("the next holder's lease ended: %v; want held", next.Err())
	}
	mustRelease(t, next)
	if err := b.Release(ctxT(t), key, next.Token()); !errors.Is(err, lock.ErrExpired) {
		t.Errorf("the backend's Release of a free lock = %v; want ErrExpired", err)
	}
}

func testBadInput(t *testing.T, b lock.Backend, key string) {
	l := lock.New(b, nil)
	for _, tc := range []struct {
		name string
		key  string
		ttl  time.Duration
		want error
	}{
		{"empty key", "", time.Second, lock.ErrInvalidKey},
		{"long key", strings.Repeat("k", lock.MaxKeyLen+1), time.Second, lock.ErrInvalidKey},
		{"zero ttl", key, 0, lock.ErrInvalidTTL},
		{"negative ttl", key, -time.Second, lock.ErrInvalidTTL},
		{"sub-millisecond ttl", key, time.Microsecond, lock.ErrInvalidTTL},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := l.TryAcquire(ctxT(t), tc.key, tc.ttl); !errors.Is(err, tc.want) {
				t.Errorf("TryAcquire = %v; want %v", err, tc.want)
			}
			if _, err := l.Acquire(ctxT(t), tc.key, tc.ttl); !errors.Is(err, tc.want) {
				t.Errorf("Acquire = %v; want %v", err, tc.want)
			}
		})
	}
	// The longest key, unique to this run like every key here.
	lease := mustTry(t, l, key+strings.Repeat("k", lock.MaxKeyLen-len(key)), time.Second)
	if err := lease.Refresh(ctxT(t), 0); !errors.Is(err, lock.ErrInvalidTTL) {
		t.Errorf("Refresh(0) = %v; want ErrInvalidTTL", err)
	}
	mustRelease(t, lease)
	// Keys with the characters backends treat specially still work.
	for _, k := range []string{key + "{x}", key + "}", key + "{", key + " spaced\n", key + "\x00nul"} {
		mustRelease(t, mustTry(t, l, k, time.Second))
	}
}

func testDo(t *testing.T, b lock.Backend, key string) {
	l := lock.New(b, nil)
	ran := false
	err := l.Do(ctxT(t), key, 10*time.Second, func(ctx context.Context, lease *lock.Lease) error {
		ran = true
		if _, err := l.TryAcquire(ctx, key, time.Second); !errors.Is(err, lock.ErrNotAcquired) {
			t.Errorf("TryAcquire inside Do = %v; want ErrNotAcquired", err)
		}
		return nil
	})
	if err != nil || !ran {
		t.Fatalf("Do = %v (ran %v); want nil, ran", err, ran)
	}
	mustRelease(t, mustTry(t, l, key, time.Second))
	boom := errors.New("boom")
	if err := l.Do(ctxT(t), key, time.Second, func(context.Context, *lock.Lease) error { return boom }); !errors.Is(err, boom) {
		t.Errorf("Do = %v; want fn's error", err)
	}
	err = l.Do(ctxT(t), key, 100*time.Millisecond, func(ctx context.Context, _ *lock.Lease) error {
		<-ctx.Done() // the lease runs out: the work's context must end
		return ctx.Err()
	})
	if !errors.Is(err, lock.ErrLost) {
		t.Errorf("Do with a lease that ran out = %v; want ErrLost", err)
	}
	// A panicking fn (recovered up the stack, as net/http does) leaves the
	// lock free and its renewal stopped, not held for good.
	auto := lock.New(b, &lock.Options{AutoRenew: true})
	func() {
		defer func() {
			if v := recover(); v != "fn failed" {
				t.Errorf("recovered %v; want fn's panic to go on", v)
			}
		}()
		_ = auto.Do(ctxT(t), key, time.Second, func(context.Context, *lock.Lease) error { panic("fn failed") })
	}()
	mustRelease(t, mustTry(t, l, key, time.Second))
}
