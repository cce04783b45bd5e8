package lock

import (
	"context"
	"time"
)

// Backend is the storage side of a lock: the few atomic operations a Locker
// builds leases, renewal and blocking waits on. Backends live in their own
// packages (memlock, redislock, sqllock, ...); users rarely call a Backend
// directly. Every method must be safe for concurrent use, and must return
// the sentinel errors of this package (wrapped) so that errors.Is works
// whatever the backend.
type Backend interface {
	// Acquire makes one attempt to take the lock for r.Owner. On success it
	// returns a Grant with a fencing token that is strictly greater than any
	// token an earlier acquire of r.Key returned. When the lock is held it
	// returns ErrNotAcquired and, when known, the time the holder's TTL has
	// left in Grant.RetryAfter. Errors reaching the backend match
	// ErrUnavailable.
	Acquire(ctx context.Context, r Request) (Grant, error)

	// Release deletes the lock only if owner holds it (compare-and-delete on
	// the server). It returns nil, ErrExpired (nobody holds it) or
	// ErrNotHeld (someone else does). It is safe to retry.
	Release(ctx context.Context, key, owner string) error

	// Refresh resets the TTL only if owner holds it (compare-and-expire),
	// returning nil, ErrExpired or ErrNotHeld like Release.
	Refresh(ctx context.Context, key, owner string, ttl time.Duration) error
}

// Request is one acquire attempt.
type Request struct {
	// Key names the lock. The Locker has validated it.
	Key string
	// Owner is the random token that identifies this holder.
	Owner string
	// TTL is how long the lock is held without a refresh; whole milliseconds.
	TTL time.Duration
	// Wait is set by a blocking Acquire. A backend that queues waiters
	// (see Waiter) then records Owner in the key's FIFO queue, for
	// WaitTTL, when the lock is held, so that it is served before later
	// arrivals; a non-waiting attempt never jumps that queue while the
	// lock is held or handed over by a release. (On the Redis backends a
	// lock whose holder let its TTL run out, a crashed holder, goes to
	// whoever asks first, a try or a waiter's next attempt.)
	Wait bool
	// WaitTTL is how long a queued waiter keeps its place without trying
	// again. A waiter that died is dropped after it.
	WaitTTL time.Duration
}

// Grant is the result of an acquire attempt.
type Grant struct {
	// Fence is the fencing token of a successful acquire.
	Fence int64
	// RetryAfter is, on ErrNotAcquired, how long the current holder's TTL
	// has left; zero when unknown.
	RetryAfter time.Duration
}

// Waiter is implemented by backends that can wake a blocked Acquire when the
// lock is released, instead of leaving it to poll. A Locker uses it when its
// backend implements it.
type Waiter interface {
	// Wait subscribes owner to release notifications for key and returns
	// once the subscription is in place (so that a release after Wait
	// returns is never missed), or on ctx's end. wake receives a value when
	// the lock may be free for owner; stop ends the subscription and must be
	// called exactly once.
	Wait(ctx context.Context, key, owner string) (wake <-chan struct{}, stop func(), err error)

	// Leave removes owner from key's waiter queue after it gave up, waking
	// the next waiter if the lock is free.
	Leave(ctx context.Context, key, owner string) error
}
