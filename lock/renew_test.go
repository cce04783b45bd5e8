package lock_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/onceguard/onceguard/lock"
	"github.com/onceguard/onceguard/lock/memlock"
)

// An auto-renewed lease costs a timer, not a goroutine: a process holding
// many leases (jobs, a user's lock per request) does not keep a goroutine
// per lease waiting for its next renewal.
func TestAutoRenewNoGoroutinePerLease(t *testing.T) {
	l := lock.New(&memlock.Backend{}, &lock.Options{AutoRenew: true})
	const n = 200
	before := runtime.NumGoroutine()
	leases := make([]*lock.Lease, n)
	for i := range leases {
		lease, err := l.TryAcquire(t.Context(), fmt.Sprintf("many-%d", i), time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		leases[i] = lease
	}
	if grew := runtime.NumGoroutine() - before; grew >= n/2 {
		t.Errorf("%d goroutines more with %d auto-renewed leases held; want about none (a timer per lease)", grew, n)
	}
	for _, lease := range leases {
		if err := lease.Release(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
}

// blockingRefresh holds every Refresh until release is closed, and counts
// the refreshes that began.
type blockingRefresh struct {
	lock.Backend
	began   chan struct{} // one value per refresh that began
	release chan struct{}
	count   atomic.Int64
}

func (b *blockingRefresh) Refresh(ctx context.Context, key, owner string, ttl time.Duration) error {
	b.count.Add(1)
	b.began <- struct{}{}
	<-b.release
	return b.Backend.Refresh(ctx, key, owner, ttl)
}

// Release waits for a renewal on its way (one that ignores its
// cancellation, here), and no renewal starts after it: once Release
// returns, the lease calls the backend no more, so its client can be
// closed.
func TestAutoRenewReleaseWaitsForRenewal(t *testing.T) {
	b := &blockingRefresh{Backend: &memlock.Backend{}, began: make(chan struct{}, 16), release: make(chan struct{})}
	l := lock.New(b, &lock.Options{AutoRenew: true})
	const ttl = 3 * time.Second // the first renewal at 1s; slack for a loaded machine before the deadline
	lease, err := l.TryAcquire(t.Context(), "renewing", ttl)
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-b.began:
	case <-time.After(10 * time.Second):
		t.Fatal("no renewal 10s after the acquire; want one after TTL/3")
	}
	released := make(chan error, 1)
	go func() { released <- lease.Release(context.Background()) }()
	select {
	case err := <-released:
		t.Fatalf("Release returned (%v) while a renewal was on its way; want it to wait for the renewal", err)
	case <-time.After(100 * time.Millisecond):
	}
	close(b.release)
	select {
	case err := <-released:
		if err != nil {
			t.Fatalf("Release = %v; want nil", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Release still waiting 10s after the renewal came back")
	}
	n := b.count.Load()
	time.Sleep(ttl) // three renewal periods
	if got := b.count.Load(); got != n {
		t.Errorf("%d refreshes after Release returned; want none", got-n)
	}
	if _, err := l.TryAcquire(t.Context(), "renewing", ttl); err != nil {
		t.Errorf("TryAcquire after Release = %v; want the lock free", err)
	}
}

// ctxRefresh holds every Refresh until its context ends, and reports
// that context's error.
type ctxRefresh struct {
	lock.Backend
	began chan struct{}
	ended chan error
}

func (c *ctxRefresh) Refresh(ctx context.Context, key, owner string, ttl time.Duration) error {
	c.began <- struct{}{}
	<-ctx.Done()
	c.ended <- ctx.Err()
	return ctx.Err()
}

// waitRenewal waits for the first renewal to reach the backend.
func waitRenewal(t *testing.T, began <-chan struct{}) {
	t.Helper()
	select {
	case <-began:
	case <-time.After(10 * time.Second):
		t.Fatal("no renewal 10s after the acquire; want one after TTL/3")
	}
}

// Release cancels a renewal on its way rather than wait for its answer,
// which no longer matters: on a slow backend the release would otherwise
// wait up to the lease's time left.
func TestReleaseCancelsRenewal(t *testing.T) {
	c := &ctxRefresh{Backend: &memlock.Backend{}, began: make(chan struct{}, 1), ended: make(chan error, 1)}
	l := lock.New(c, &lock.Options{AutoRenew: true})
	const ttl = 6 * time.Second // the renewal at 2s, its context ends 4s later
	lease, err := l.TryAcquire(t.Context(), "cancel-renewal", ttl)
	if err != nil {
		t.Fatal(err)
	}
	waitRenewal(t, c.began)
	start := time.Now()
	if err := lease.Release(context.Background()); err != nil {
		t.Fatalf("Release = %v; want nil", err)
	}
	if took := time.Since(start); took > ttl/3 {
		t.Errorf("Release took %v with a renewal on its way; want it to cancel the renewal, not wait for it (4s)", took)
	}
	select {
	case err := <-c.ended:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("the renewal's context ended with %v; want context.Canceled by Release", err)
		}
	default:
		t.Error("Release returned before the renewal it waits for did")
	}
	if _, err := l.TryAcquire(t.Context(), "cancel-renewal", ttl); err != nil {
		t.Errorf("TryAcquire after Release = %v; want the lock free", err)
	}
}

// A renewal that ignores its cancellation holds Release up to
// ReleaseTimeout, not for as long as it hangs.
func TestReleaseBoundedWhileRenewalHangs(t *testing.T) {
	b := &blockingRefresh{Backend: &memlock.Backend{}, began: make(chan struct{}, 16), release: make(chan struct{})}
	defer close(b.release)
	const timeout = 300 * time.Millisecond
	l := lock.New(b, &lock.Options{AutoRenew: true, ReleaseTimeout: timeout})
	lease, err := l.TryAcquire(t.Context(), "hung-renewal", 3*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	waitRenewal(t, b.began)
	released := make(chan error, 1)
	start := time.Now()
	go func() { released <- lease.Release(context.Background()) }()
	select {
	case err := <-released:
		// memlock releases whatever its context: the lock is free.
		if err != nil {
			t.Errorf("Release = %v; want nil", err)
		}
		if took := time.Since(start); took < timeout-timeout/8 {
			t.Errorf("Release returned after %v; want it to wait for the renewal up to ReleaseTimeout, %v", took, timeout)
		}
	case <-time.After(10 * timeout):
		t.Fatalf("Release still waiting %v after it began, behind a hung renewal; want at most ReleaseTimeout, %v", 10*timeout, timeout)
	}
}

// hangingRefresh holds every Refresh, whatever its context, until unblock
// is closed.
type hangingRefresh struct {
	lock.Backend
	unblock chan struct{}
}

func (h *hangingRefresh) Refresh(ctx context.Context, key, owner string, ttl time.Duration) error {
	<-h.unblock
	return h.Backend.Refresh(ctx, key, owner, ttl)
}

// An auto-renewed lease whose renewal does not come back ends at its
// deadline, and Observe is told then, whether or not anyone watches the
// lease (Done, Context): a lock-lost metric must not wait for a hung
// backend.
func TestAutoRenewEndsAtDeadlineWhileRenewalHangs(t *testing.T) {
	h := &hangingRefresh{Backend: &memlock.Backend{}, unblock: make(chan struct{})}
	lost := make(chan time.Time, 1)
	l := lock.New(h, &lock.Options{AutoRenew: true, Observe: func(e lock.Event) {
		if e.Op == lock.OpLost {
			lost <- time.Now()
		}
	}})
	const ttl = 1500 * time.Millisecond // the renewal at 500ms hangs
	lease, err := l.TryAcquire(t.Context(), "hung", ttl)
	if err != nil {
		t.Fatal(err)
	}
	deadline := lease.Deadline()
	select {
	case at := <-lost:
		if at.Before(deadline) {
			t.Errorf("OpLost %v before the lease's deadline; want at it", deadline.Sub(at))
		}
	case <-time.After(time.Until(deadline) + 3*time.Second):
		t.Fatal("no OpLost 3s past the lease's deadline while its renewal hangs; want it at the deadline")
	}
	if err := lease.Err(); !errors.Is(err, lock.ErrLost) || !errors.Is(err, lock.ErrExpired) {
		t.Errorf("Err = %v; want ErrLost and ErrExpired", err)
	}
	// The hung refresh lands (it may extend the lock on the backend, whose
	// TTL has not quite run out); Release waits for it and frees the lock.
	close(h.unblock)
	_ = lease.Release(t.Context())
	if _, err := l.TryAcquire(t.Context(), "hung", ttl); err != nil {
		t.Errorf("TryAcquire after Release = %v; want the lock free", err)
	}
}

// A caller's Refresh to a shorter TTL moves the next renewal to a third
// of it: a renewal still due a third of the old TTL away would come after
// the lease ran out.
func TestAutoRenewAfterRefreshToShorterTTL(t *testing.T) {
	l := lock.New(&memlock.Backend{}, &lock.Options{AutoRenew: true})
	lease, err := l.TryAcquire(t.Context(), "shorter", 30*time.Second) // renewed every 10s
	if err != nil {
		t.Fatal(err)
	}
	const ttl = time.Second // renewed every 333ms from now
	if err := lease.Refresh(t.Context(), ttl); err != nil {
		t.Fatal(err)
	}
	time.Sleep(3 * ttl)
	if err := lease.Err(); err != nil {
		t.Fatalf("Err 3 TTLs after a Refresh to %v = %v; want the lease held by its renewals", ttl, err)
	}
	if err := lease.Release(t.Context()); err != nil {
		t.Fatal(err)
	}
}

// reorder holds the answer of the first Refresh (a renewal), which has
// reached the backend, until a second one (the caller's) has been
// answered: the backend applies them in one order, the lease hears them
// in the other.
type reorder struct {
	lock.Backend
	n      atomic.Int64
	began  chan struct{}
	second chan struct{}
}

func (r *reorder) Refresh(ctx context.Context, key, owner string, ttl time.Duration) error {
	switch r.n.Add(1) {
	case 1:
		err := r.Backend.Refresh(ctx, key, owner, ttl)
		close(r.began)
		<-r.second
		return err
	case 2:
		defer close(r.second)
	}
	return r.Backend.Refresh(ctx, key, owner, ttl)
}

// Refreshes on their way at once may be applied in one order and answered
// in another. The lease must never believe it holds the lock longer than
// the backend does: here the backend keeps the caller's 300ms, and the
// renewal's 3s, answered last, must not become the lease's deadline (nor
// its TTL: renewals go on at the caller's).
func TestRefreshesAnsweredOutOfOrder(t *testing.T) {
	m := &memlock.Backend{}
	r := &reorder{Backend: m, began: make(chan struct{}), second: make(chan struct{})}
	l := lock.New(r, &lock.Options{AutoRenew: true})
	lease, err := l.TryAcquire(t.Context(), "reordered", 3*time.Second) // the renewal at 1s
	if err != nil {
		t.Fatal(err)
	}
	<-r.began
	const ttl = 300 * time.Millisecond
	if err := lease.Refresh(t.Context(), ttl); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * ttl) // the renewal's answer is in; the backend's 300ms have passed unless renewed
	if left := time.Until(lease.Deadline()); left > ttl {
		t.Errorf("the lease's deadline is %v away; want at most the TTL the backend applied last, %v", left, ttl)
	}
	other, err := lock.New(m, nil).TryAcquire(t.Context(), "reordered", time.Second)
	if err == nil {
		t.Errorf("another owner took the lock while the lease's Err = %v", lease.Err())
		_ = other.Release(t.Context())
	}
	_ = lease.Release(t.Context())
}

// stuckRefresh holds the first Refresh (a renewal) until its context ends,
// or with ignoreCtx until unblock is closed; later ones (the caller's) go
// through.
type stuckRefresh struct {
	lock.Backend
	n         atomic.Int64
	began     chan struct{}
	ignoreCtx bool
	unblock   chan struct{}
}

func (s *stuckRefresh) Refresh(ctx context.Context, key, owner string, ttl time.Duration) error {
	if s.n.Add(1) == 1 {
		close(s.began)
		if !s.ignoreCtx {
			<-ctx.Done()
			return ctx.Err()
		}
		<-s.unblock
	}
	return s.Backend.Refresh(ctx, key, owner, ttl)
}

// A caller's Refresh while a renewal is on its way moves the deadline the
// renew timer watches: the lease ends, and Observe hears OpLost, at the
// new deadline, whether it moved earlier (a shorter TTL) or later while
// the renewal hangs.
func TestAutoRenewEndsAtDeadlineRefreshedDuringRenewal(t *testing.T) {
	for _, tc := range []struct {
		name      string
		ttl, to   time.Duration
		ignoreCtx bool
	}{
		{"shorter", 6 * time.Second, 500 * time.Millisecond, false},
		{"longer-while-hung", 1500 * time.Millisecond, 2 * time.Second, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := &stuckRefresh{Backend: &memlock.Backend{}, began: make(chan struct{}), ignoreCtx: tc.ignoreCtx, unblock: make(chan struct{})}
			defer close(s.unblock)
			lost := make(chan time.Time, 1)
			l := lock.New(s, &lock.Options{AutoRenew: true, Observe: func(e lock.Event) {
				if e.Op == lock.OpLost {
					lost <- time.Now()
				}
			}})
			lease, err := l.TryAcquire(t.Context(), "moved", tc.ttl)
			if err != nil {
				t.Fatal(err)
			}
			<-s.began
			if err := lease.Refresh(t.Context(), tc.to); err != nil {
				t.Fatal(err)
			}
			deadline := lease.Deadline()
			select {
			case at := <-lost:
				if late := at.Sub(deadline); late > time.Second || late < 0 {
					t.Errorf("OpLost %v from the lease's deadline; want at it", late)
				}
			case <-time.After(time.Until(deadline) + 3*time.Second):
				t.Fatal("no OpLost 3s past the lease's deadline; want it at the deadline")
			}
		})
	}
}

// The tests below are helper-14's review of b3d2ee0 (refreshes on their
// way at once, and renewal after the deadline moved).

// orderedRefresh: the renewal (ttl long) is applied first and answered once the
// caller's (ttl short) has been applied; the caller's answer is held.
type orderedRefresh struct {
	lock.Backend
	long                       time.Duration
	rBegan, rApplied, cApplied chan struct{}
	holdC                      chan struct{}
	once1, once2               sync.Once
}

func (r *orderedRefresh) Refresh(ctx context.Context, key, owner string, ttl time.Duration) error {
	if ttl == r.long {
		first := false
		r.once1.Do(func() { first = true })
		if !first {
			return r.Backend.Refresh(ctx, key, owner, ttl)
		}
		close(r.rBegan)
		err := r.Backend.Refresh(ctx, key, owner, ttl)
		close(r.rApplied)
		<-r.cApplied
		return err
	}
	<-r.rApplied
	err := r.Backend.Refresh(ctx, key, owner, ttl)
	close(r.cApplied)
	<-r.holdC
	return err
}

// Safety: a renewal answered while a shorter caller Refresh that the
// backend applied after it is still on its way sets the deadline to the
// renewal's 3s; the backend keeps 300ms.
func TestRenewalAnsweredBeforeShorterRefresh(t *testing.T) {
	m := &memlock.Backend{}
	r := &orderedRefresh{Backend: m, long: 3 * time.Second, rBegan: make(chan struct{}), rApplied: make(chan struct{}), cApplied: make(chan struct{}), holdC: make(chan struct{})}
	l := lock.New(r, &lock.Options{AutoRenew: true})
	lease, err := l.TryAcquire(t.Context(), "k", 3*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	<-r.rBegan
	done := make(chan error, 1)
	go func() { done <- lease.Refresh(context.Background(), 300*time.Millisecond) }()
	<-r.cApplied
	time.Sleep(600 * time.Millisecond)
	notTakenWhileHeld(t, m, lease)
	close(r.holdC)
	<-done
	_ = lease.Release(t.Context())
}

// notTakenWhileHeld fails t when another owner can take lease's lock on
// backend b while the lease says it is held.
func notTakenWhileHeld(t *testing.T, b lock.Backend, lease *lock.Lease) {
	t.Helper()
	left, lerr := time.Until(lease.Deadline()), lease.Err()
	other, err := lock.New(b, nil).TryAcquire(t.Context(), lease.Key(), time.Second)
	if err != nil {
		return
	}
	if lerr == nil {
		t.Errorf("another owner took the lock while the lease's Err = nil, its deadline %v away", left.Round(time.Millisecond))
	}
	_ = other.Release(t.Context())
}

// Same, no renewal at all: a lone Refresh to a shorter TTL applied by the
// backend, answer late (pre-existing).
type heldAnswer struct {
	lock.Backend
	applied, hold chan struct{}
}

func (r *heldAnswer) Refresh(ctx context.Context, key, owner string, ttl time.Duration) error {
	err := r.Backend.Refresh(ctx, key, owner, ttl)
	close(r.applied)
	<-r.hold
	return err
}

func TestShorterRefreshAnsweredLate(t *testing.T) {
	m := &memlock.Backend{}
	r := &heldAnswer{Backend: m, applied: make(chan struct{}), hold: make(chan struct{})}
	lease, err := lock.New(r, nil).TryAcquire(t.Context(), "k", 3*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- lease.Refresh(context.Background(), 300*time.Millisecond) }()
	<-r.applied
	time.Sleep(600 * time.Millisecond)
	notTakenWhileHeld(t, m, lease)
	close(r.hold)
	<-done
}

// slowTTL delays the refreshes at ttl slow by d and signals the first.
type slowTTL struct {
	lock.Backend
	slow  time.Duration
	d     time.Duration
	began chan struct{}
	once  sync.Once
}

func (s *slowTTL) Refresh(ctx context.Context, key, owner string, ttl time.Duration) error {
	if ttl == s.slow {
		s.once.Do(func() { close(s.began) })
		time.Sleep(s.d)
	}
	return s.Backend.Refresh(ctx, key, owner, ttl)
}

// Liveness: a renewal (900ms) and a caller's Refresh to 30s overlap and
// both succeed. The deadline is the renewal's (~1.2s after acquire), but
// the next renewal is 10s away (the caller's TTL/3): the lease is lost.
func TestOverlapWithLongerRefreshKeepsRenewing(t *testing.T) {
	s := &slowTTL{Backend: &memlock.Backend{}, slow: 900 * time.Millisecond, d: 100 * time.Millisecond, began: make(chan struct{})}
	var lost atomic.Value
	l := lock.New(s, &lock.Options{AutoRenew: true, Observe: func(e lock.Event) {
		if e.Op == lock.OpLost {
			lost.Store(e.Err)
		}
	}})
	lease, err := l.TryAcquire(t.Context(), "k", 900*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	<-s.began
	if err := lease.Refresh(t.Context(), 30*time.Second); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * time.Second)
	if err := lease.Err(); err != nil {
		t.Errorf("every refresh succeeded, yet Err = %v (OpLost: %v)", err, lost.Load())
	}
	_ = lease.Release(t.Context())
}

// delayedRefresh delays every refresh by d.
type delayedRefresh struct {
	lock.Backend
	d time.Duration
}

func (s *delayedRefresh) Refresh(ctx context.Context, key, owner string, ttl time.Duration) error {
	time.Sleep(s.d)
	return s.Backend.Refresh(ctx, key, owner, ttl)
}

// Liveness: two goroutines refresh in staggered loops, so some refresh is
// always on its way; earliest keeps the first group member's deadline.
func TestChainedOverlappingRefreshes(t *testing.T) {
	b := &delayedRefresh{Backend: &memlock.Backend{}, d: 100 * time.Millisecond}
	lease, err := lock.New(b, nil).TryAcquire(t.Context(), "k", 600*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	errs := make(chan error, 2)
	stop := time.Now().Add(2 * time.Second)
	for i := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			time.Sleep(time.Duration(i) * 50 * time.Millisecond)
			for time.Now().Before(stop) {
				if err := lease.Refresh(context.Background(), 600*time.Millisecond); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Errorf("refreshing every 100ms with a 600ms TTL: %v", err)
	}
}

// failingTTL fails every refresh at ttl short without reaching the backend.
type failingTTL struct {
	lock.Backend
	short time.Duration
}

func (f *failingTTL) Refresh(ctx context.Context, key, owner string, ttl time.Duration) error {
	if ttl == f.short {
		return context.DeadlineExceeded
	}
	return f.Backend.Refresh(ctx, key, owner, ttl)
}

// Liveness: a caller's Refresh to 300ms fails (transient); the deadline is
// lowered to 300ms (it may have been applied) but the renewal stays at
// TTL/3 = 1s: the auto-renewed lease is lost though the backend holds 3s.
func TestFailedShorterRefreshKeepsRenewing(t *testing.T) {
	m := &memlock.Backend{}
	lease, err := lock.New(&failingTTL{Backend: m, short: 300 * time.Millisecond}, &lock.Options{AutoRenew: true}).TryAcquire(t.Context(), "k", 3*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if err := lease.Refresh(t.Context(), 300*time.Millisecond); err == nil {
		t.Fatal("want an error")
	}
	time.Sleep(1500 * time.Millisecond)
	if err := lease.Err(); err != nil {
		t.Errorf("auto-renewed lease, refresh failed transiently: Err = %v", err)
	}
	_ = lease.Release(t.Context())
}

// The tests below are helper-15's review of 59affb7.

// fuzzBackend applies each refresh at a random moment between its send and
// its answer (or not at all for some failures), and records the backend's
// expiry (apply time + ttl) in apply order.
type fuzzBackend struct {
	lock.Backend
	mu      sync.Mutex
	expires time.Time
	failPct int
}

func (f *fuzzBackend) Acquire(ctx context.Context, r lock.Request) (lock.Grant, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	now := time.Now()
	g, err := f.Backend.Acquire(ctx, r)
	if err == nil {
		f.expires = now.Add(r.TTL)
	}
	return g, err
}

func (f *fuzzBackend) Refresh(ctx context.Context, key, owner string, ttl time.Duration) error {
	time.Sleep(time.Duration(rand.IntN(20)) * time.Millisecond)
	mode := rand.IntN(100)
	var err error
	if mode >= f.failPct/2 { // applied (maybe reported as failed)
		f.mu.Lock()
		now := time.Now()
		err = f.Backend.Refresh(ctx, key, owner, ttl)
		if err == nil {
			f.expires = now.Add(ttl)
		}
		f.mu.Unlock()
	} else {
		err = errors.New("transient (not applied)")
	}
	time.Sleep(time.Duration(rand.IntN(20)) * time.Millisecond)
	if err == nil && mode < f.failPct {
		err = errors.New("transient (applied)")
	}
	return err
}

// Safety, as a property: refreshes of random TTLs from three goroutines
// (and renewals), each applied at a random moment before its answer or not
// at all, some reported failed though applied: a lease that says it is
// held never has a deadline past the backend's expiry.
func TestRefreshDeadlineNeverPastBackend(t *testing.T) {
	for _, auto := range []bool{false, true} {
		f := &fuzzBackend{Backend: &memlock.Backend{}, failPct: 20}
		l := lock.New(f, &lock.Options{AutoRenew: auto})
		lease, err := l.TryAcquire(t.Context(), "k", 200*time.Millisecond)
		if err != nil {
			t.Fatal(err)
		}
		stop := time.Now().Add(1500 * time.Millisecond)
		var wg sync.WaitGroup
		var violations atomic.Int64
		var first atomic.Value
		for range 3 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for time.Now().Before(stop) {
					ttl := time.Duration(60+rand.IntN(400)) * time.Millisecond
					_ = lease.Refresh(context.Background(), ttl)
					time.Sleep(time.Duration(rand.IntN(15)) * time.Millisecond)
				}
			}()
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(stop) {
				f.mu.Lock()
				exp := f.expires
				d := lease.Deadline()
				lerr := lease.Err()
				f.mu.Unlock()
				if lerr == nil && d.After(exp) {
					if violations.Add(1) == 1 {
						first.Store(d.Sub(exp))
					}
				}
				time.Sleep(200 * time.Microsecond)
			}
		}()
		wg.Wait()
		_ = lease.Release(t.Context())
		if n := violations.Load(); n > 0 {
			t.Errorf("auto=%v: %d snapshots with the lease's deadline past the backend's expiry (first by %v)", auto, n, first.Load())
		}
	}
}

// hungTTL: the caller's Refresh at ttl short hangs (not applied) until
// unblock; renewals go through.
type hungTTL struct {
	lock.Backend
	short   time.Duration
	unblock chan struct{}
}

func (h *hungTTL) Refresh(ctx context.Context, key, owner string, ttl time.Duration) error {
	if ttl == h.short {
		<-h.unblock
		return ctx.Err()
	}
	return h.Backend.Refresh(ctx, key, owner, ttl)
}

// Liveness: a caller's Refresh hangs past its TTL and is never applied;
// the renewals that succeed meanwhile keep the lease (a refresh on its way
// caps the deadline only from the last success on, not from its send).
func TestHungRefreshWithRenewals(t *testing.T) {
	h := &hungTTL{Backend: &memlock.Backend{}, short: 999 * time.Millisecond, unblock: make(chan struct{})}
	l := lock.New(h, &lock.Options{AutoRenew: true})
	lease, err := l.TryAcquire(t.Context(), "k", time.Second)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	go func() { _ = lease.Refresh(ctx, 999*time.Millisecond) }()
	time.Sleep(1500 * time.Millisecond)
	if err := lease.Err(); err != nil {
		_, oerr := lock.New(h.Backend, nil).TryAcquire(t.Context(), "k", time.Second)
		t.Errorf("renewals succeeding, a caller's Refresh hung: Err = %v (another owner's TryAcquire: %v)", err, oerr)
	}
	close(h.unblock)
	_ = lease.Release(t.Context())
}

// hungRenewalCtxRelease holds every Refresh, whatever its context, until
// unblock is closed; its Release honours its context, as database/sql and
// rueidis do (memlock ignores it).
type hungRenewalCtxRelease struct {
	lock.Backend
	began   chan struct{}
	unblock chan struct{}
}

func (b *hungRenewalCtxRelease) Refresh(ctx context.Context, key, owner string, ttl time.Duration) error {
	b.began <- struct{}{}
	<-b.unblock
	return b.Backend.Refresh(context.Background(), key, owner, ttl)
}

func (b *hungRenewalCtxRelease) Release(ctx context.Context, key, owner string) error {
	if err := ctx.Err(); err != nil {
		return errors.Join(lock.ErrUnavailable, err)
	}
	return b.Backend.Release(ctx, key, owner)
}

// Release is sent before it waits for a renewal on its way: a renewal that
// hangs past ReleaseTimeout must not leave the release a context that
// has already ended, and the lock held until its TTL.
func TestReleaseSentBeforeWaitingForRenewal(t *testing.T) {
	b := &hungRenewalCtxRelease{Backend: &memlock.Backend{}, began: make(chan struct{}, 4), unblock: make(chan struct{})}
	defer close(b.unblock)
	l := lock.New(b, &lock.Options{AutoRenew: true, ReleaseTimeout: 300 * time.Millisecond})
	lease, err := l.TryAcquire(t.Context(), "no-time-left", 3*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	waitRenewal(t, b.began)
	if err := lease.Release(context.Background()); err != nil {
		t.Errorf("Release = %v; want the release sent before the wait (nil)", err)
	}
	if _, err := l.TryAcquire(t.Context(), "no-time-left", time.Second); err != nil {
		t.Errorf("TryAcquire after Release = %v; want the lock free", err)
	}
}

// lateRenewal holds the renewal's Refresh, whatever its context, until
// the release has reached the backend; then lets it land (after the
// release, so it finds the lock gone) and, inside Release, gives the
// lease time to take the renewal's answer in.
type lateRenewal struct {
	lock.Backend
	began   chan struct{}
	unblock chan struct{}
	lease   atomic.Pointer[lock.Lease]
}

func (b *lateRenewal) Refresh(ctx context.Context, key, owner string, ttl time.Duration) error {
	b.began <- struct{}{}
	<-b.unblock
	return b.Backend.Refresh(context.Background(), key, owner, ttl)
}

func (b *lateRenewal) Release(ctx context.Context, key, owner string) error {
	err := b.Backend.Release(ctx, key, owner)
	close(b.unblock)
	for end := time.Now().Add(300 * time.Millisecond); time.Now().Before(end) && b.lease.Load().Err() == nil; {
		time.Sleep(time.Millisecond)
	}
	return err
}

// A renewal answered during the release, after the release got there,
// finds the lock gone; the lease still ends released, not lost: Err is
// nil, the context's cause ErrReleased, and Observe hears no OpLost.
func TestLateRenewalAnswerDuringRelease(t *testing.T) {
	b := &lateRenewal{Backend: &memlock.Backend{}, began: make(chan struct{}, 4), unblock: make(chan struct{})}
	var lost atomic.Int32
	l := lock.New(b, &lock.Options{AutoRenew: true, Observe: func(e lock.Event) {
		if e.Op == lock.OpLost {
			lost.Add(1)
		}
	}})
	lease, err := l.TryAcquire(t.Context(), "late-renewal", 6*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	b.lease.Store(lease)
	ctx := lease.Context()
	waitRenewal(t, b.began)
	if err := lease.Release(context.Background()); err != nil {
		t.Errorf("Release = %v; want nil", err)
	}
	if err := lease.Err(); err != nil {
		t.Errorf("Err after a successful Release = %v; want nil", err)
	}
	if cause := context.Cause(ctx); !errors.Is(cause, lock.ErrReleased) {
		t.Errorf("the lease's context ended with %v; want ErrReleased", cause)
	}
	if n := lost.Load(); n > 0 {
		t.Errorf("%d OpLost for a lease released successfully", n)
	}
}

// slowFirstRelease holds the first Release's answer until unblock is
// closed (the release itself is done at once).
type slowFirstRelease struct {
	lock.Backend
	calls   atomic.Int32
	firstIn chan struct{}
	unblock chan struct{}
}

func (b *slowFirstRelease) Release(ctx context.Context, key, owner string) error {
	err := b.Backend.Release(ctx, key, owner)
	if b.calls.Add(1) == 1 {
		close(b.firstIn)
		<-b.unblock
	}
	return err
}

// Two Releases of one lease at once: the one that finds the lock already
// released must not end the lease as lost before the other records its
// success. The second waits for the first and reports ErrNotHeld.
func TestConcurrentReleases(t *testing.T) {
	b := &slowFirstRelease{Backend: &memlock.Backend{}, firstIn: make(chan struct{}), unblock: make(chan struct{})}
	var lost atomic.Int32
	l := lock.New(b, &lock.Options{Observe: func(e lock.Event) {
		if e.Op == lock.OpLost {
			lost.Add(1)
		}
	}})
	lease, err := l.TryAcquire(t.Context(), "two-releases", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	first, second := make(chan error, 1), make(chan error, 1)
	go func() { first <- lease.Release(context.Background()) }()
	<-b.firstIn
	go func() { second <- lease.Release(context.Background()) }()
	select {
	case err := <-second: // the old code: answered, and recorded, before the first
		close(b.unblock)
		t.Errorf("the second Release returned (%v) while the first was on its way; want it to wait for the first", err)
	case <-time.After(200 * time.Millisecond):
		close(b.unblock)
		if err := <-second; !errors.Is(err, lock.ErrNotHeld) {
			t.Errorf("second Release = %v; want ErrNotHeld (released by the first)", err)
		}
	}
	if err := <-first; err != nil {
		t.Errorf("first Release = %v; want nil", err)
	}
	if err := lease.Err(); err != nil {
		t.Errorf("Err = %v; want nil, released", err)
	}
	if n := lost.Load(); n > 0 {
		t.Errorf("%d OpLost for a lease released by one of two Releases", n)
	}
}

// callerKey marks a caller's Refresh, so the backend tells it from a
// renewal's.
type callerKey struct{}

// watchedBackend delays every Refresh by up to 3ms (honouring its
// context) and every Release's answer by up to 2ms, and records the
// renewals on their way per owner and the refreshes cancelled.
type watchedBackend struct {
	lock.Backend
	mu        sync.Mutex
	renewals  map[string]int
	cancelled atomic.Int64
}

func (b *watchedBackend) Refresh(ctx context.Context, key, owner string, ttl time.Duration) error {
	if ctx.Value(callerKey{}) == nil {
		b.mu.Lock()
		b.renewals[owner]++
		b.mu.Unlock()
		defer func() {
			b.mu.Lock()
			b.renewals[owner]--
			b.mu.Unlock()
		}()
	}
	t := time.NewTimer(time.Duration(rand.IntN(3000)) * time.Microsecond)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
		b.cancelled.Add(1)
		return ctx.Err()
	}
	return b.Backend.Refresh(ctx, key, owner, ttl)
}

func (b *watchedBackend) Release(ctx context.Context, key, owner string) error {
	err := b.Backend.Release(ctx, key, owner)
	time.Sleep(time.Duration(rand.IntN(2000)) * time.Microsecond) // answers may come back in any order
	return err
}

// Two Releases and a caller's Refresh of each lease at once, with
// renewals starting and ending around them: each lease ends released,
// not lost (one Release returns nil, the other ErrNotHeld, no OpLost), and
// no renewal is still on its way once the Releases returned.
// (TestAutoRenewReleaseWaitsForRenewal checks that none starts after.)
func TestReleaseUnderConcurrency(t *testing.T) {
	b := &watchedBackend{Backend: &memlock.Backend{}, renewals: map[string]int{}}
	var mu sync.Mutex
	lost := map[string]int{}
	l := lock.New(b, &lock.Options{AutoRenew: true, Observe: func(e lock.Event) {
		if e.Op == lock.OpLost {
			mu.Lock()
			lost[e.Key]++
			mu.Unlock()
		}
	}})
	const workers, per = 6, 40
	const ttl = 300 * time.Millisecond // renewals every 100ms, each up to 3ms
	var wg sync.WaitGroup
	var checked atomic.Int64
	for w := range workers {
		wg.Go(func() {
			for i := range per {
				key := fmt.Sprintf("concurrent-%d-%d", w, i)
				lease, err := l.TryAcquire(t.Context(), key, ttl)
				if err != nil {
					t.Error(err)
					return
				}
				time.Sleep(time.Duration(rand.IntN(120)) * time.Millisecond)
				if lease.Err() != nil {
					continue // lost before the Releases (a renewal late on a loaded machine): not this test's case
				}
				var inner sync.WaitGroup
				results := make([]error, 2)
				for j := range results {
					inner.Go(func() { results[j] = lease.Release(context.Background()) })
				}
				inner.Go(func() { _ = lease.Refresh(context.WithValue(context.Background(), callerKey{}, true), ttl) })
				inner.Wait()
				checked.Add(1)
				ok, notHeld := 0, 0
				for _, err := range results {
					switch {
					case err == nil:
						ok++
					case errors.Is(err, lock.ErrNotHeld):
						notHeld++
					}
				}
				if ok != 1 || notHeld != 1 {
					t.Errorf("%s: Releases = %v; want one nil and one ErrNotHeld", key, results)
				}
				if err := lease.Err(); err != nil {
					t.Errorf("%s: Err after Release = %v; want nil", key, err)
				}
				b.mu.Lock()
				if n := b.renewals[lease.Token()]; n > 0 {
					t.Errorf("%s: %d renewals on their way after Release returned", key, n)
				}
				b.mu.Unlock()
				mu.Lock()
				if n := lost[key]; n > 0 {
					t.Errorf("%s: %d OpLost for a lease released", key, n)
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	t.Logf("%d leases released under concurrency; %d refreshes cancelled", checked.Load(), b.cancelled.Load())
	if checked.Load() < workers*per/2 {
		t.Errorf("only %d of %d leases held until their Releases; want most", checked.Load(), workers*per)
	}
}

// failOnceRelease fails the first Release with ErrUnavailable (without
// touching the lock), then releases.
type failOnceRelease struct {
	lock.Backend
	calls atomic.Int32
}

func (b *failOnceRelease) Release(ctx context.Context, key, owner string) error {
	if b.calls.Add(1) == 1 {
		return lock.ErrUnavailable
	}
	return b.Backend.Release(ctx, key, owner)
}

// A retry after a Release that failed ("retrying after a backend error is
// safe") that succeeds leaves Err nil: the lease was released. Its
// context keeps the cause it ended with first.
func TestReleaseRetryAfterBackendError(t *testing.T) {
	b := &failOnceRelease{Backend: &memlock.Backend{}}
	var lost atomic.Int32
	l := lock.New(b, &lock.Options{Observe: func(e lock.Event) {
		if e.Op == lock.OpLost {
			lost.Add(1)
		}
	}})
	lease, err := l.TryAcquire(t.Context(), "retry", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if err := lease.Release(context.Background()); !errors.Is(err, lock.ErrUnavailable) {
		t.Fatalf("first Release = %v; want ErrUnavailable", err)
	}
	if err := lease.Release(context.Background()); err != nil {
		t.Fatalf("retry = %v; want nil", err)
	}
	if n := lost.Load(); n > 0 {
		t.Errorf("%d OpLost for a lease released by a retry", n)
	}
	if err := lease.Err(); err != nil {
		t.Errorf("Err after a successful Release (retry) = %v; want nil", err)
	}
	if err := lease.Release(context.Background()); !errors.Is(err, lock.ErrNotHeld) {
		t.Errorf("a third Release = %v; want ErrNotHeld", err)
	}
}

// hangFirstRelease: the first Release ignores its context and hangs until
// unblock; later Releases answer at once.
type hangFirstRelease struct {
	lock.Backend
	calls   atomic.Int32
	firstIn chan struct{}
	unblock chan struct{}
}

func (b *hangFirstRelease) Release(ctx context.Context, key, owner string) error {
	if b.calls.Add(1) == 1 {
		close(b.firstIn)
		<-b.unblock
		return errors.Join(lock.ErrUnavailable, context.DeadlineExceeded)
	}
	return b.Backend.Release(ctx, key, owner)
}

// A second Release waits for the first within its own ReleaseTimeout,
// then says ErrUnavailable: a backend that ignores its context must not
// hold every later Release (a retry from another goroutine, a Done
// watcher's Release) for ever.
func TestSecondReleaseBoundedByItsTimeout(t *testing.T) {
	b := &hangFirstRelease{Backend: &memlock.Backend{}, firstIn: make(chan struct{}), unblock: make(chan struct{})}
	l := lock.New(b, &lock.Options{ReleaseTimeout: 100 * time.Millisecond})
	lease, err := l.TryAcquire(t.Context(), "hung-first", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	first := make(chan error, 1)
	go func() { first <- lease.Release(context.Background()) }()
	<-b.firstIn
	second := make(chan error, 1)
	start := time.Now()
	go func() { second <- lease.Release(context.Background()) }()
	select {
	case err := <-second:
		if !errors.Is(err, lock.ErrUnavailable) {
			t.Errorf("second Release behind a hung first = %v; want ErrUnavailable", err)
		}
	case <-time.After(2 * time.Second):
		t.Errorf("second Release still blocked after %v with ReleaseTimeout 100ms (behind a first Release whose backend ignores its context)", time.Since(start))
	}
	close(b.unblock)
	<-first
	if err := lease.Release(context.Background()); err != nil {
		t.Errorf("a Release after the first failed = %v; want nil (the lock was still held)", err)
	}
}

// lostDuringRelease: the renewal's Refresh waits for the Release to
// begin and then finds the lock taken by another owner (ErrNotHeld);
// the Release fails (unreachable).
type lostDuringRelease struct {
	lock.Backend
	began      chan struct{}
	relStarted chan struct{}
	refreshed  chan struct{}
}

func (b *lostDuringRelease) Refresh(ctx context.Context, key, owner string, ttl time.Duration) error {
	b.began <- struct{}{}
	<-b.relStarted
	defer close(b.refreshed)
	return lock.ErrNotHeld // another owner holds it now
}

func (b *lostDuringRelease) Release(ctx context.Context, key, owner string) error {
	close(b.relStarted)
	<-b.refreshed // the refresh's answer is in before the release's
	return errors.Join(lock.ErrUnavailable, errors.New("connection reset"))
}

// A renewal that finds the lock held by another owner while Release is on
// its way, and a Release that then fails: the lease ends lost, with
// OpLost and an Err matching ErrNotHeld.
func TestLossSeenDuringFailedRelease(t *testing.T) {
	b := &lostDuringRelease{Backend: &memlock.Backend{}, began: make(chan struct{}, 4), relStarted: make(chan struct{}), refreshed: make(chan struct{})}
	var mu sync.Mutex
	var events []lock.Event
	l := lock.New(b, &lock.Options{AutoRenew: true, Observe: func(e lock.Event) {
		mu.Lock()
		events = append(events, e)
		mu.Unlock()
	}})
	lease, err := l.TryAcquire(t.Context(), "lost-during-release", 300*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	waitRenewal(t, b.began)
	rerr := lease.Release(context.Background())
	mu.Lock()
	defer mu.Unlock()
	lost := 0
	for _, e := range events {
		if e.Op == lock.OpLost {
			lost++
		}
	}
	if !errors.Is(rerr, lock.ErrUnavailable) {
		t.Errorf("Release = %v; want the backend's error", rerr)
	}
	if err := lease.Err(); !errors.Is(err, lock.ErrLost) || !errors.Is(err, lock.ErrNotHeld) {
		t.Errorf("Err = %v; want ErrLost and ErrNotHeld", err)
	}
	if lost != 1 {
		t.Errorf("%d OpLost although a renewal found the lock held by another owner; want 1", lost)
	}
}

// hungRenewalQuickRelease: the renewal's Refresh ignores its context and
// hangs until unblock (a statement shielded from cancellation, as
// XactBackend.Refresh's is); Release answers at once and signals it.
type hungRenewalQuickRelease struct {
	lock.Backend
	began    chan struct{}
	unblock  chan struct{}
	released chan struct{}
}

func (b *hungRenewalQuickRelease) Refresh(ctx context.Context, key, owner string, ttl time.Duration) error {
	b.began <- struct{}{}
	<-b.unblock
	return errors.Join(lock.ErrUnavailable, context.DeadlineExceeded)
}

func (b *hungRenewalQuickRelease) Release(ctx context.Context, key, owner string) error {
	err := b.Backend.Release(ctx, key, owner)
	close(b.released)
	return err
}

// Release records the backend's answer before it waits for a renewal on
// its way. Else, during the wait, (a) the lock is free on the backend and
// another owner takes it while the lease says it is held (Err nil, Done
// open), and (b) if the lease's deadline passes, the lease ends lost
// (OpLost, Err non-nil, cause ErrExpired) though Release returns nil.
func TestReleaseRecordedBeforeWaitingForRenewal(t *testing.T) {
	mem := &memlock.Backend{}
	b := &hungRenewalQuickRelease{Backend: mem, began: make(chan struct{}, 4), unblock: make(chan struct{}), released: make(chan struct{})}
	var lost atomic.Int32
	l := lock.New(b, &lock.Options{AutoRenew: true, Observe: func(e lock.Event) {
		if e.Op == lock.OpLost {
			lost.Add(1)
		}
	}})
	lease, err := l.TryAcquire(t.Context(), "recorded-late", 600*time.Millisecond) // renewal at ~200ms
	if err != nil {
		t.Fatal(err)
	}
	ctx := lease.Context()
	waitRenewal(t, b.began)
	relStart := time.Now()
	left := time.Until(lease.Deadline())
	done := make(chan error, 1)
	go func() { done <- lease.Release(context.Background()) }()
	<-b.released
	// The backend has released the lock, well before the lease's deadline.
	other, oerr := lock.New(mem, nil).TryAcquire(t.Context(), "recorded-late", time.Minute)
	select {
	case <-ctx.Done():
	default:
		if oerr == nil && lease.Err() == nil {
			t.Errorf("another owner holds the lock (fence %d) while the lease, released %v before its deadline, says it is held (Err nil, Done open)", other.Fence(), left.Round(time.Millisecond))
		}
	}
	time.Sleep(left + 100*time.Millisecond) // the renewal still hangs; the lease's deadline passes
	close(b.unblock)
	rerr := <-done
	if rerr != nil || lease.Err() != nil || !errors.Is(context.Cause(ctx), lock.ErrReleased) || lost.Load() > 0 {
		t.Errorf("Release = %v after %v; Err() = %v; cause = %v; OpLost = %d; want a lease released %v before its deadline to end released",
			rerr, time.Since(relStart).Round(time.Millisecond), lease.Err(), context.Cause(ctx), lost.Load(), left.Round(time.Millisecond))
	}
}

// lossAfterRecorded: the renewal's Refresh waits until the Release's
// failure has been recorded (the lease ended), then finds the lock held by
// another owner. The Release fails (unreachable). Same facts as
// TestLossSeenDuringFailedRelease, answers in the other order.
type lossAfterRecorded struct {
	lock.Backend
	began      chan struct{}
	relStarted chan struct{}
	lease      atomic.Pointer[lock.Lease]
}

func (b *lossAfterRecorded) Refresh(ctx context.Context, key, owner string, ttl time.Duration) error {
	b.began <- struct{}{}
	<-b.relStarted
	for b.lease.Load().Err() == nil { // the Release's answer is recorded
		time.Sleep(time.Millisecond)
	}
	return lock.ErrNotHeld // another owner holds it now
}

func (b *lossAfterRecorded) Release(ctx context.Context, key, owner string) error {
	close(b.relStarted)
	return errors.Join(lock.ErrUnavailable, errors.New("connection reset"))
}

// A renewal that finds the lock held by another owner, answered after a
// failed Release was recorded: the lease ends lost with one OpLost and an
// Err matching ErrNotHeld, as when the answers come the other way round
// (TestLossSeenDuringFailedRelease).
func TestLossSeenAfterFailedRelease(t *testing.T) {
	b := &lossAfterRecorded{Backend: &memlock.Backend{}, began: make(chan struct{}, 4), relStarted: make(chan struct{})}
	var lost atomic.Int32
	l := lock.New(b, &lock.Options{AutoRenew: true, Observe: func(e lock.Event) {
		if e.Op == lock.OpLost {
			lost.Add(1)
		}
	}})
	lease, err := l.TryAcquire(t.Context(), "loss-after", 300*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	b.lease.Store(lease)
	waitRenewal(t, b.began)
	rerr := lease.Release(context.Background()) // waits for the renewal, so both answers are in
	if !errors.Is(rerr, lock.ErrUnavailable) {
		t.Errorf("Release = %v; want the backend's error", rerr)
	}
	if err := lease.Err(); !errors.Is(err, lock.ErrNotHeld) || lost.Load() != 1 {
		t.Errorf("a renewal found the lock held by another owner after the failed release was recorded: Err = %v, OpLost = %d; want ErrNotHeld and 1 OpLost", err, lost.Load())
	}
}

// acceptingRelease answers every Release with success, as a backend
// whose TTL has not yet run out where the lease's local one has.
type acceptingRelease struct{ lock.Backend }

func (b acceptingRelease) Release(ctx context.Context, key, owner string) error {
	_ = b.Backend.Release(ctx, key, owner)
	return nil
}

// A lease that ended by its local deadline (Done closed, OpLost, cause
// ErrExpired), then a Release the backend still accepts: Err keeps saying
// lost, as the context's cause and the event do.
func TestExpiredLeaseReleasedStaysLost(t *testing.T) {
	var lost atomic.Int32
	l := lock.New(acceptingRelease{&memlock.Backend{}}, &lock.Options{Observe: func(e lock.Event) {
		if e.Op == lock.OpLost {
			lost.Add(1)
		}
	}})
	lease, err := l.TryAcquire(t.Context(), "expired-then-released", time.Second) // local validity 988ms
	if err != nil {
		t.Fatal(err)
	}
	<-lease.Done() // the expiry timer ends it at ~988ms
	before := lease.Err()
	rerr := lease.Release(context.Background())
	after := lease.Err()
	if before == nil {
		t.Fatal("Err = nil once Done is closed; want the lease lost")
	}
	if rerr != nil {
		t.Fatalf("Release = %v; want nil (the backend accepts it)", rerr)
	}
	if after == nil {
		t.Errorf("a lease that ended lost (ErrExpired, OpLost %d) reads Err nil after Release; cause still %v", lost.Load(), context.Cause(lease.Context()))
	}
}

// hungRenewal: the renewal's Refresh ignores its context until unblock.
type hungRenewal struct {
	lock.Backend
	began   chan struct{}
	unblock chan struct{}
}

func (b *hungRenewal) Refresh(ctx context.Context, key, owner string, ttl time.Duration) error {
	b.began <- struct{}{}
	<-b.unblock
	return lock.ErrUnavailable
}

// A second Release once the first's success is recorded, while the first
// still waits for a renewal that ignores its context: ErrNotHeld (it was
// released), not ErrUnavailable after waiting for the first to return.
func TestSecondReleaseAfterRecordedSuccess(t *testing.T) {
	b := &hungRenewal{Backend: &memlock.Backend{}, began: make(chan struct{}, 4), unblock: make(chan struct{})}
	l := lock.New(b, &lock.Options{AutoRenew: true, ReleaseTimeout: 100 * time.Millisecond})
	lease, err := l.TryAcquire(t.Context(), "second-after-success", 3*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	waitRenewal(t, b.began)
	first := make(chan error, 1)
	go func() { first <- lease.Release(context.Background()) }()
	for lease.Context().Err() == nil { // the first's answer is recorded
		time.Sleep(time.Millisecond)
	}
	second := lease.Release(context.Background())
	close(b.unblock)
	f := <-first
	if f != nil {
		t.Errorf("first Release = %v; want nil", f)
	}
	if !errors.Is(second, lock.ErrNotHeld) {
		t.Errorf("second Release after the first's success was recorded = %v; want ErrNotHeld", second)
	}
}

// retryRace: the first Release fails without reaching the lock; the retry
// releases it, then answers only after a caller's Refresh (sent before the
// first Release) has found the lock gone, released by the retry itself.
type retryRace struct {
	*memlock.Backend
	calls        atomic.Int32
	refreshBegan chan struct{}
	applied      chan struct{}
	refreshDone  chan struct{}
}

func (b *retryRace) Refresh(ctx context.Context, key, owner string, ttl time.Duration) error {
	close(b.refreshBegan)
	<-b.applied // the retry's release has been applied
	return b.Backend.Refresh(ctx, key, owner, ttl)
}

func (b *retryRace) Release(ctx context.Context, key, owner string) error {
	if b.calls.Add(1) == 1 {
		return errors.Join(lock.ErrUnavailable, errors.New("connection reset")) // never reached the lock
	}
	err := b.Backend.Release(ctx, key, owner)
	close(b.applied)
	select {
	case <-b.refreshDone: // its answer comes after the refresh's
	case <-time.After(5 * time.Second):
	}
	return err
}

// A retried Release that succeeds is the lease's release, also when a
// refresh on its way found the lock gone because of that very retry: no
// OpLost, Err nil.
func TestRetryReleaseBesideRefresh(t *testing.T) {
	b := &retryRace{Backend: &memlock.Backend{}, refreshBegan: make(chan struct{}), applied: make(chan struct{}), refreshDone: make(chan struct{})}
	var lost atomic.Int32
	l := lock.New(b, &lock.Options{Observe: func(e lock.Event) {
		if e.Op == lock.OpLost {
			lost.Add(1)
		}
	}})
	lease, err := l.TryAcquire(t.Context(), "retry-beside-refresh", 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	refreshed := make(chan error, 1)
	go func() { refreshed <- lease.Refresh(context.Background(), 5*time.Second) }()
	<-b.refreshBegan
	if err := lease.Release(context.Background()); !errors.Is(err, lock.ErrUnavailable) {
		t.Fatalf("first Release = %v; want ErrUnavailable", err)
	}
	retried := make(chan error, 1)
	go func() { retried <- lease.Release(context.Background()) }()
	rerr := <-refreshed
	close(b.refreshDone)
	retry := <-retried
	if !errors.Is(rerr, lock.ErrNotHeld) {
		t.Errorf("the Refresh that met the retry's release = %v; want ErrNotHeld (the premise)", rerr)
	}
	if retry != nil {
		t.Fatalf("retry = %v; want nil", retry)
	}
	if lost.Load() != 0 || lease.Err() != nil {
		t.Errorf("the retry released the lock (nil), yet OpLost = %d and Err = %v; want 0 and nil", lost.Load(), lease.Err())
	}
}

// relGate: Release waits for go-ahead; the renewal hangs, ignoring its
// context, until unblock.
type relGate struct {
	*memlock.Backend
	began, entered, proceed, unblock chan struct{}
}

func (b *relGate) Refresh(ctx context.Context, key, owner string, ttl time.Duration) error {
	b.began <- struct{}{}
	<-b.unblock
	return lock.ErrUnavailable
}

func (b *relGate) Release(ctx context.Context, key, owner string) error {
	close(b.entered)
	<-b.proceed
	return b.Backend.Release(ctx, key, owner)
}

// A second Release already waiting when the first's success is recorded
// returns then (ErrNotHeld), not when the first finishes waiting for its
// renewal.
func TestWaitingSecondReleaseAfterSuccess(t *testing.T) {
	b := &relGate{Backend: &memlock.Backend{}, began: make(chan struct{}, 4), entered: make(chan struct{}), proceed: make(chan struct{}), unblock: make(chan struct{})}
	const timeout = time.Second
	l := lock.New(b, &lock.Options{AutoRenew: true, ReleaseTimeout: timeout})
	lease, err := l.TryAcquire(t.Context(), "waiting-second", 3*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	waitRenewal(t, b.began)
	first := make(chan error, 1)
	go func() { first <- lease.Release(context.Background()) }()
	<-b.entered
	second := make(chan error, 1)
	go func() { second <- lease.Release(context.Background()) }()
	time.Sleep(20 * time.Millisecond) // the second waits for the first
	close(b.proceed)
	for lease.Context().Err() == nil { // the first's success is recorded
		time.Sleep(time.Millisecond)
	}
	recorded := time.Now()
	var serr error
	select {
	case serr = <-second:
	case <-time.After(3 * timeout):
		t.Fatal("second Release still waiting")
	}
	waited := time.Since(recorded)
	close(b.unblock)
	f := <-first
	if f != nil {
		t.Errorf("first Release = %v; want nil", f)
	}
	if !errors.Is(serr, lock.ErrNotHeld) || waited > timeout/4 {
		t.Errorf("second Release = %v after %v; want ErrNotHeld at once", serr, waited.Round(time.Millisecond))
	}
}
