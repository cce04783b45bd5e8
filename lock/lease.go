package lock

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"
)

// Lease is a held lock. Its methods are safe for concurrent use.
//
// A lease ends when it is released, when its TTL passes without a refresh
// (measured locally on the monotonic clock, with a margin for clock drift
// between this process and the backend), or when automatic renewal finds the
// lock gone. Done and Context report the end at once, so that work done
// under the lock can stop: a lease you no longer hold protects nothing.
//
// Even a held lease is only an efficiency guarantee under process pauses:
// pass Fence to the resource and let it refuse writes carrying an older
// fence (see the package documentation).
type Lease struct {
	locker *Locker
	key    string
	owner  string
	fence  int64
	start  time.Time // when the acquire that granted it was sent

	mu sync.Mutex // guards the fields below
	// The flags side by side, in one word.
	releasing bool // Release began: its answer, not a refresh's, says how the lease ends
	relBusy   bool // a Release is on its way: another waits for it (wake), within its own context
	goneSeen  bool // while releasing, a refresh found the lock gone
	relFailed bool // a failed Release ended the lease, without OpLost
	ended     bool
	released  bool // the backend confirmed the release (or that it was not held)
	renewing  bool // a renewal's refresh is on its way (see renew)
	ttl       time.Duration
	deadline  time.Time // local validity end, monotonic
	cause     error     // why it ended: ErrReleased, or an error matching ErrLost

	// Refreshes on their way (refresh), in the order they were sent.
	inflight []*pendingRefresh

	// The context and its expiry timer are made on first use of Done,
	// Context: a lease nobody watches costs no expiry timer.
	ctx    context.Context
	cancel context.CancelCauseFunc
	expiry *time.Timer

	// relCtx is the context of the first Release (see releaseContext):
	// set once, under mu, and never changed. It keeps that caller's
	// context (for its values) as long as the lease lives.
	relCtx detached

	// Renewal (AutoRenew only): renew fires a third of the way to the
	// deadline and refreshes the lease on the timer's own goroutine, so no
	// goroutine waits between renewals. While a refresh is on its way
	// (renewing), the timer is set for the lease's deadline, so that the
	// lease ends there even if the refresh is late. No renewal starts
	// once releasing is set; after the release, Release cancels the one
	// on its way (stopRenew) and waits for it to return.
	renew     *time.Timer        // set once in newLease; Reset and Stop under mu
	stopRenew context.CancelFunc // under mu: the context of the renewal on its way

	// wake, under mu, is made by a Release that waits (waitLocked) and
	// closed when what it may wait for changes: a renewal or a Release
	// ends (broadcastLocked).
	wake chan struct{}
}

func newLease(l *Locker, key, owner string, ttl time.Duration, fence int64, start time.Time) *Lease {
	ls := &Lease{locker: l, key: key, owner: owner, fence: fence, start: start, ttl: ttl, deadline: start.Add(validity(ttl))}
	if l.opts.AutoRenew {
		ls.mu.Lock() // a renewal due at once reads ls.renew under mu
		ls.renew = time.AfterFunc(ls.renewEveryLocked(), ls.renewal)
		ls.mu.Unlock()
	}
	return ls
}

// validity is how long a lease is trusted locally: its TTL less a margin for
// drift between our clock and the backend's (1% plus up to 2ms).
func validity(ttl time.Duration) time.Duration {
	return ttl - ttl/100 - min(2*time.Millisecond, ttl/10)
}

// Key returns the lock's name.
func (ls *Lease) Key() string { return ls.key }

// Token returns the random owner token the backend stores for this lease.
func (ls *Lease) Token() string { return ls.owner }

// Fence returns the fencing token: a number that strictly increases with
// every successful acquire of the same key. Send it with every write made
// under the lock and let the resource refuse a write whose fence is lower
// than the last it accepted: that stops a holder that was paused past its
// TTL from overwriting the work of the next holder. Fences are seeded
// from the backend server's clock in microseconds (see the package
// documentation).
func (ls *Lease) Fence() int64 { return ls.fence }

// Deadline returns when the lease ends unless it is refreshed.
func (ls *Lease) Deadline() time.Time {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	return ls.deadline
}

// Done returns a channel that is closed when the lease ends: released, run
// out, or found lost by renewal.
func (ls *Lease) Done() <-chan struct{} { return ls.watch().Done() }

// Context returns a context that is cancelled when the lease ends. Its
// cause (context.Cause) is ErrReleased after Release, or matches ErrLost
// otherwise.
func (ls *Lease) Context() context.Context { return ls.watch() }

// watch makes the lease's context and expiry timer if they do not exist.
func (ls *Lease) watch() context.Context {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	if ls.ctx == nil {
		ls.ctx, ls.cancel = context.WithCancelCause(context.Background())
		ls.checkLocked()
		if ls.ended {
			ls.cancel(ls.cause)
		} else {
			ls.expiry = time.AfterFunc(time.Until(ls.deadline), ls.expire)
		}
	}
	return ls.ctx
}

// Err returns nil while the lease is held, nil after Release, and an error
// matching ErrLost (and ErrExpired or ErrNotHeld when known) when it ended
// any other way.
func (ls *Lease) Err() error {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	ls.checkLocked()
	if ls.ended && ls.cause != ErrReleased {
		return ls.cause
	}
	return nil
}

// Refresh extends the lease to ttl from now, if it is still held. It
// returns ErrExpired or ErrNotHeld (and ends the lease) when it is not,
// ErrInvalidTTL for a TTL under a millisecond, and the backend's error
// when the backend cannot be reached; then the lease keeps its deadline,
// or the one ttl would give if that is earlier (the refresh may have
// reached the backend). A lease that has ended is never revived.
//
// A refresh that failed can still reach the backend later (a command
// sent before the client gave up on it): after a failed Refresh to a
// shorter TTL, Refresh again before relying on the lease.
func (ls *Lease) Refresh(ctx context.Context, ttl time.Duration) error {
	ttl, err := check(ls.key, ttl)
	if err != nil {
		return err
	}
	return ls.refresh(ctx, ttl, true)
}

// pendingRefresh is a refresh on its way: when it was sent and its TTL;
// until, the deadline it gives the lease if the backend applies it last
// (raised as refreshes after it succeed); and seen, the earliest until of
// the refreshes that answered while it was on its way (zero: none).
type pendingRefresh struct {
	sent, until, seen time.Time
	ttl               time.Duration
}

// refresh sends a refresh to ttl (the caller's, or a renewal's) and moves
// the lease's deadline. The backend may apply refreshes on their way at
// once (a caller's beside a renewal) in any order, and answer them in
// another; one that failed may have reached it all the same. So the
// deadline never stays later than what a refresh on its way would leave
// on the backend if applied last: it is lowered when the refresh is sent
// (a shorter TTL), and an answer moves it to the earliest of its own and
// those of the refreshes that were on their way at any time with it.
func (ls *Lease) refresh(ctx context.Context, ttl time.Duration, caller bool) error {
	if err := ls.endedErr(); err != nil {
		return err
	}
	p := &pendingRefresh{sent: time.Now(), ttl: ttl}
	p.until = p.sent.Add(validity(ttl))
	ls.mu.Lock()
	ls.inflight = append(ls.inflight, p)
	if p.until.Before(ls.deadline) {
		ls.setDeadlineLocked(p.until)
	}
	ls.mu.Unlock()
	err := ls.locker.backend.Refresh(ctx, ls.key, ls.owner, ttl)
	ls.mu.Lock()
	defer ls.mu.Unlock()
	ls.inflight = slices.DeleteFunc(ls.inflight, func(q *pendingRefresh) bool { return q == p })
	until := p.until
	if !p.seen.IsZero() && p.seen.Before(until) {
		until = p.seen
	}
	for _, q := range ls.inflight {
		if q.seen.IsZero() || p.until.Before(q.seen) {
			q.seen = p.until // p may have been applied after q
		}
		if err == nil {
			// p was applied, after it was sent: q, if applied after p,
			// leaves at least its TTL from then.
			if later := p.sent.Add(validity(q.ttl)); later.After(q.until) {
				q.until = later
			}
		}
		if q.until.Before(until) {
			until = q.until // q may be applied after p
		}
	}
	switch {
	case errors.Is(err, ErrNotHeld) && ls.releasing:
		// Maybe the release got there first: Release's answer ends the
		// lease, unless it failed; then this one says it was lost.
		ls.goneSeen = true
		if ls.relFailed && !ls.relBusy { // it failed already, and no retry is on its way
			ls.lostDuringFailedReleaseLocked()
		}
		return err
	case errors.Is(err, ErrNotHeld):
		ls.endLocked(lostError(ls.key, err))
		return err
	case err != nil:
		return err // the deadline was lowered when it was sent
	}
	if ls.checkLocked(); ls.ended {
		// Ended locally while the refresh was on its way: stay ended.
		return ls.endedErrLocked()
	}
	if caller {
		ls.ttl = ttl // a renewal keeps the TTL a caller set meanwhile
	}
	ls.setDeadlineLocked(until)
	return nil
}

// setDeadlineLocked moves the lease's deadline to d, and the timers that
// watch it: the expiry timer, and the renew timer (AutoRenew). While a
// renewal is on its way, that ends the lease at the deadline if the
// renewal is late; else the next renewal is a third of the time left
// away, as after a renewal.
func (ls *Lease) setDeadlineLocked(d time.Time) {
	if ls.ended {
		return
	}
	ls.deadline = d
	if ls.expiry != nil {
		ls.expiry.Reset(time.Until(d))
	}
	switch {
	case ls.renew == nil || ls.releasing:
	case ls.renewing:
		ls.renew.Reset(time.Until(d))
	default:
		ls.renew.Reset(ls.renewEveryLocked())
	}
}

// Release gives the lock back. It runs on a context detached from ctx's
// cancellation (with ctx's values), bounded by Options.ReleaseTimeout
// (rounded up by at most 1/64 of it), so that a cancelled
// request still releases. It returns nil, ErrExpired when the TTL had
// already passed, ErrNotHeld when another owner holds the lock or the lease
// was already released, or the backend's error; retrying after a backend
// error is safe because release compares the owner token, and a retry
// that succeeds leaves Err nil (the lease's context keeps the cause it
// ended with).
//
// Releases of one lease run one at a time: one that finds another on its
// way waits for its answer (within its own ReleaseTimeout, else it
// returns ErrUnavailable), and returns ErrNotHeld if that one released
// the lock. With Options.AutoRenew no renewal starts once Release begins;
// a renewal on its way when the release has been answered is cancelled,
// and Release waits for it to return, within the same ReleaseTimeout, so
// that the lease calls the backend no more once Release returns.
func (ls *Lease) Release(ctx context.Context) error {
	rctx := ls.releaseContext(ctx)
	ls.mu.Lock()
	for ls.relBusy && !ls.released {
		if !ls.waitLocked(rctx) {
			ls.mu.Unlock()
			return fmt.Errorf("release %q: %w: another Release of the lease is still on its way (%w)", ls.key, ErrUnavailable, context.Cause(rctx))
		}
	}
	if ls.released {
		ls.mu.Unlock()
		return fmt.Errorf("release %q: %w", ls.key, ErrNotHeld)
	}
	ls.relBusy, ls.releasing = true, true
	if ls.renew != nil {
		ls.renew.Stop()
	}
	ls.mu.Unlock()

	err := ls.locker.backend.Release(rctx, ls.key, ls.owner)
	ls.mu.Lock()
	// The answer is recorded at once: the lock may be another owner's
	// already, and the lease must not say it is held meanwhile.
	if err == nil || errors.Is(err, ErrNotHeld) {
		ls.released = true
		ls.broadcastLocked() // a second Release waiting can return now
	}
	switch {
	case err == nil && ls.relFailed:
		// A retry after a failed Release: released after all.
		ls.relFailed, ls.cause = false, ErrReleased
	case err == nil:
		ls.endLocked(ErrReleased)
	case errors.Is(err, ErrNotHeld):
		ls.endLocked(lostError(ls.key, err)) // lost while held: OpLost
	default:
		// The release did not reach the backend, or failed there: the
		// lease ends here (the caller gave it up), but nothing showed it
		// lost while held. The OpRelease event below reports the error;
		// the backend lets the lock go when its TTL passes. Unless the
		// TTL had passed already: then it was lost (ErrExpired).
		if ls.checkLocked(); !ls.ended {
			ls.endQuietLocked(lostError(ls.key, err))
			ls.relFailed = true
			if ls.goneSeen { // a refresh found the lock gone meanwhile
				ls.lostDuringFailedReleaseLocked()
			}
		}
	}
	if ls.renewing {
		// Its answer no longer matters (it compares the owner, so if it
		// lands after the release it finds the lock gone). Cancelled only
		// now, it cannot disturb the release: on a backend whose cancelled
		// statement breaks the session holding the lock, that would free
		// the lock under the release.
		ls.stopRenew()
		for ls.renewing {
			if !ls.waitLocked(rctx) {
				break
			}
		}
	}
	if ls.relFailed && ls.goneSeen {
		// A refresh found the lock gone while this Release (a retry, or
		// one waiting for the renewal) was on its way, and it failed.
		ls.lostDuringFailedReleaseLocked()
	}
	ls.relBusy = false
	ls.broadcastLocked()
	ls.mu.Unlock()
	ls.locker.observe(OpRelease, ls.key, false, ls.start, err)
	return err
}

// lostDuringFailedReleaseLocked reports a lease that a failed Release
// ended as lost after all, since a refresh found the lock gone while the
// release was on its way (in either order): OpLost, and Err says so. The
// lease's context keeps the cause it ended with.
func (ls *Lease) lostDuringFailedReleaseLocked() {
	ls.relFailed = false
	ls.cause = lostError(ls.key, fmt.Errorf("%w: a refresh found the lock gone while the release failed", ErrNotHeld))
	ls.locker.observe(OpLost, ls.key, false, ls.start, ls.cause)
}

// waitLocked waits, mu held, until broadcastLocked or the end of ctx; it
// returns with mu held, false if ctx ended.
func (ls *Lease) waitLocked(ctx context.Context) bool {
	if ls.wake == nil {
		ls.wake = make(chan struct{})
	}
	w := ls.wake
	ls.mu.Unlock()
	defer ls.mu.Lock()
	select {
	case <-w:
		return true
	case <-ctx.Done():
		return false
	}
}

// broadcastLocked wakes every waitLocked.
func (ls *Lease) broadcastLocked() {
	if ls.wake != nil {
		close(ls.wake)
		ls.wake = nil
	}
}

// releaseContext returns the context a Release runs on (see
// deadlines.detach). The lease holds the first one, which saves an
// allocation per lock cycle; a Release after it (a retry after a backend
// error, which needs a deadline of its own) gets one of its own, so the
// lease's is never written while in use.
func (ls *Lease) releaseContext(ctx context.Context) context.Context {
	c := ls.locker.release.detach(ctx, time.Now())
	ls.mu.Lock()
	defer ls.mu.Unlock()
	if ls.relCtx.Context == nil {
		ls.relCtx = c
		return &ls.relCtx
	}
	own := c
	return &own
}

// renewal is the renew timer's function. It refreshes the lease and sets
// the timer for the next renewal: a third of the time the lease has left
// after a success, sooner after a transient error. It stops for good
// when the lease has ended or Release began. Fired while a refresh is on
// its way (the lease's deadline came first), it only ends the lease.
func (ls *Lease) renewal() {
	ls.mu.Lock()
	if ls.checkLocked(); ls.releasing || ls.ended || ls.renewing {
		ls.mu.Unlock()
		return
	}
	ls.renewing = true
	ttl, left := ls.ttl, time.Until(ls.deadline)
	ls.renew.Reset(left)
	ctx, cancel := context.WithTimeout(context.Background(), max(left, time.Millisecond))
	ls.stopRenew = cancel
	ls.mu.Unlock()
	err := ls.refresh(ctx, ttl, false)
	cancel()
	ls.mu.Lock()
	defer ls.mu.Unlock()
	ls.renewing, ls.stopRenew = false, nil
	ls.broadcastLocked()
	if ls.checkLocked(); ls.releasing || ls.ended {
		return // released, or lost for good
	}
	next := ls.renewEveryLocked()
	if err != nil {
		// Transient: try again soon, within the time left now; the lease
		// ends at its deadline if no renewal lands before it.
		next = max(time.Millisecond, next/4)
	}
	ls.renew.Reset(next)
}

// renewEveryLocked is how long after a renewal the next is due: a third
// of the time the lease has left (a third of its TTL after a refresh).
func (ls *Lease) renewEveryLocked() time.Duration {
	return max(time.Millisecond, time.Until(ls.deadline)/3)
}

// expire runs when the expiry timer fires.
func (ls *Lease) expire() {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	if ls.checkLocked(); !ls.ended && ls.expiry != nil {
		ls.expiry.Reset(time.Until(ls.deadline)) // refreshed meanwhile
	}
}

// checkLocked ends the lease if its deadline passed.
func (ls *Lease) checkLocked() {
	if !ls.ended && !time.Now().Before(ls.deadline) {
		ls.endLocked(lostError(ls.key, ErrExpired))
	}
}

func lostError(key string, err error) error {
	return fmt.Errorf("%w: %q: %w", ErrLost, key, err)
}

// endLocked ends the lease with cause, once, and reports any cause but
// ErrReleased as an OpLost.
func (ls *Lease) endLocked(cause error) {
	if !ls.ended && cause != ErrReleased {
		ls.locker.observe(OpLost, ls.key, false, ls.start, cause)
	}
	ls.endQuietLocked(cause)
}

// endQuietLocked ends the lease with cause, once, without an event.
func (ls *Lease) endQuietLocked(cause error) {
	if ls.ended {
		return
	}
	ls.ended, ls.cause = true, cause
	if ls.expiry != nil {
		ls.expiry.Stop()
	}
	if ls.renew != nil {
		ls.renew.Stop()
	}
	if ls.cancel != nil {
		ls.cancel(cause)
	}
}

func (ls *Lease) endedErr() error {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	ls.checkLocked()
	return ls.endedErrLocked()
}

// endedErrLocked returns the reason the lease ended, matching ErrNotHeld,
// or nil while it is held.
func (ls *Lease) endedErrLocked() error {
	switch {
	case ls.released || ls.cause == ErrReleased:
		return fmt.Errorf("lease %q: %w", ls.key, ErrNotHeld)
	case !ls.ended:
		return nil
	case errors.Is(ls.cause, ErrNotHeld):
		return ls.cause
	}
	return fmt.Errorf("%w: %w", ls.cause, ErrNotHeld)
}
