package lock

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"time"
)

// MaxKeyLen is the longest key, in bytes, a Locker accepts.
const MaxKeyLen = 512

// Options configure a Locker. A nil *Options means all defaults.
type Options struct {
	// AutoRenew refreshes every lease every TTL/3 until Release, from a
	// timer: no goroutine waits between renewals, and a lease released
	// before its first renewal costs one timer. When a refresh finds the
	// lock gone the lease ends at once; transient errors are retried until
	// the lease's local deadline, then the lease ends. No renewal starts
	// once Release begins; once the release is answered, Release cancels
	// a renewal on its way and waits for it to return, within
	// ReleaseTimeout. Renewal needs timers and the backend to answer well
	// within a third of the TTL: keep auto-renewed TTLs at 100ms or more
	// (a 10ms lease has been lost to scheduling delays on a loaded
	// machine). Default: false.
	AutoRenew bool

	// MinBackoff and MaxBackoff bound the jittered exponential backoff
	// between attempts of a blocking Acquire. With a backend that wakes
	// waiters (Waiter), MaxBackoff is only the polling fallback. Defaults:
	// 5ms and 250ms.
	MinBackoff, MaxBackoff time.Duration

	// MaxWait bounds a blocking Acquire in addition to its context.
	// Default: 0, only the context bounds it.
	MaxWait time.Duration

	// ReleaseTimeout bounds Release, which runs on a context detached from
	// the caller's cancellation so that a cancelled request never leaves
	// the lock held until its TTL. Releases share deadlines: one may get
	// up to ReleaseTimeout/64 more. Default: 5s.
	ReleaseTimeout time.Duration

	// Observe, if set, is told of every acquire, release and lost lease,
	// for metrics and logs. It runs synchronously, on the caller's
	// goroutine or the lease's (sometimes with the lease's mutex held):
	// keep it fast, and do not call the Locker or the Lease from it.
	Observe func(Event)
}

// Op is what an Event reports.
type Op int

// Lock operations.
const (
	OpAcquire Op = iota + 1 // TryAcquire or Acquire returned
	OpRelease               // Release returned
	OpLost                  // a lease ended while held: expired, renewal found it gone, or Release found it expired or another owner's (Err matches ErrNotHeld)
)

// String returns the op's name: "acquire", "release" or "lost".
func (o Op) String() string {
	switch o {
	case OpAcquire:
		return "acquire"
	case OpRelease:
		return "release"
	case OpLost:
		return "lost"
	}
	return fmt.Sprintf("Op(%d)", int(o))
}

// An Event is one lock operation (Options.Observe).
type Event struct {
	Op  Op     // what happened
	Key string // high cardinality: fit for a log line, never a metric label
	// Wait: the acquire was a blocking Acquire (false: TryAcquire).
	Wait bool
	// Duration: for OpAcquire the time to the answer (the wait), for
	// OpRelease and OpLost how long the lease had been held.
	Duration time.Duration
	// Err is the result: nil for a lease granted or released, an error
	// matching ErrNotAcquired, ErrUnavailable, ... otherwise; for OpLost
	// the cause (matching ErrLost and ErrNotHeld). A Release that did not
	// reach the backend (ErrUnavailable) is an OpRelease with that error,
	// not an OpLost: the lease was not lost while held, and the backend
	// lets the lock go when its TTL passes.
	Err error
}

// observe reports an event whose Duration runs from since, if anyone
// listens: without Options.Observe it does not even read the clock.
func (l *Locker) observe(op Op, key string, wait bool, since time.Time, err error) {
	if l.opts.Observe != nil {
		l.opts.Observe(Event{Op: op, Key: key, Wait: wait, Duration: time.Since(since), Err: err})
	}
}

func (o *Options) withDefaults() Options {
	var v Options
	if o != nil {
		v = *o
	}
	if v.MinBackoff <= 0 {
		v.MinBackoff = 5 * time.Millisecond
	}
	if v.MaxBackoff <= 0 {
		v.MaxBackoff = 250 * time.Millisecond
	}
	if v.MaxBackoff < v.MinBackoff {
		v.MaxBackoff = v.MinBackoff
	}
	if v.ReleaseTimeout <= 0 {
		v.ReleaseTimeout = 5 * time.Second
	}
	return v
}

// Locker hands out leases on named locks kept by a Backend. It is safe for
// concurrent use; create one per backend and options and share it.
type Locker struct {
	backend Backend
	waiter  Waiter // backend as a Waiter, or nil
	opts    Options
	release *deadlines // Release's contexts
}

// New returns a Locker on backend. opts may be nil. It panics on a nil
// backend (a Locker has no usable zero value: use New).
func New(backend Backend, opts *Options) *Locker {
	if backend == nil {
		panic("lock: New needs a Backend")
	}
	l := &Locker{backend: backend, opts: opts.withDefaults()}
	l.release = newDeadlines(l.opts.ReleaseTimeout)
	l.waiter, _ = backend.(Waiter)
	return l
}

// Backend returns the backend the Locker was created with.
func (l *Locker) Backend() Backend { return l.backend }

// TryAcquire makes one attempt to take the lock named key for ttl. It
// returns ErrNotAcquired at once when the lock is held (or when blocked
// waiters are queued for it), ErrInvalidKey or ErrInvalidTTL for bad input,
// and an error matching ErrUnavailable when the backend cannot be reached.
// TTLs are truncated to whole milliseconds.
func (l *Locker) TryAcquire(ctx context.Context, key string, ttl time.Duration) (*Lease, error) {
	ttl, err := check(key, ttl)
	if err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, errors.Join(ErrNotAcquired, err)
	}
	owner := newOwner()
	start := time.Now()
	g, err := l.backend.Acquire(ctx, Request{Key: key, Owner: owner, TTL: ttl})
	if err != nil {
		if ctx.Err() != nil && !errors.Is(err, ErrNotAcquired) {
			err = errors.Join(ErrNotAcquired, ctx.Err(), err)
		}
		l.observe(OpAcquire, key, false, start, err)
		return nil, err
	}
	l.observe(OpAcquire, key, false, start, nil)
	return newLease(l, key, owner, ttl, g.Fence, start), nil
}

// Acquire takes the lock named key for ttl, waiting while it is held until
// ctx ends or Options.MaxWait passes. Waiters are served in arrival order on
// backends that queue them (memlock, redislock); on others they retry with
// jittered exponential backoff. When the wait ends without the lock, the
// error matches both ErrNotAcquired and ctx.Err() (context.DeadlineExceeded
// for MaxWait) and the waiter has left the queue. Backend errors are
// returned at once.
func (l *Locker) Acquire(ctx context.Context, key string, ttl time.Duration) (*Lease, error) {
	if l.opts.Observe == nil {
		return l.acquire(ctx, key, ttl)
	}
	start := time.Now()
	lease, err := l.acquire(ctx, key, ttl)
	l.observe(OpAcquire, key, true, start, err)
	return lease, err
}

func (l *Locker) acquire(ctx context.Context, key string, ttl time.Duration) (*Lease, error) {
	ttl, err := check(key, ttl)
	if err != nil {
		return nil, err
	}
	if l.opts.MaxWait > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, l.opts.MaxWait)
		defer cancel()
	}
	if err := ctx.Err(); err != nil {
		return nil, errors.Join(ErrNotAcquired, err)
	}
	req := Request{Key: key, Owner: newOwner(), TTL: ttl, Wait: true, WaitTTL: 4 * l.opts.MaxBackoff}
	if req.WaitTTL < time.Second {
		req.WaitTTL = time.Second
	}
	var (
		wake    <-chan struct{}
		stop    func()
		queued  bool
		backoff = l.opts.MinBackoff
		timer   *time.Timer
	)
	defer func() {
		if stop != nil {
			stop()
		}
		if timer != nil {
			timer.Stop()
		}
	}()
	for {
		start := time.Now()
		g, err := l.backend.Acquire(ctx, req)
		if err == nil {
			lease := newLease(l, key, req.Owner, ttl, g.Fence, start)
			if ctx.Err() != nil {
				// The caller gave up while the winning attempt was on its
				// way: hand the lock straight back.
				_ = lease.Release(ctx)
				return nil, errors.Join(ErrNotAcquired, ctx.Err())
			}
			return lease, nil
		}
		if !errors.Is(err, ErrNotAcquired) {
			l.leave(ctx, queued, key, req.Owner)
			if ctx.Err() != nil {
				// The wait ended during the attempt: that, not the
				// backend, is the answer.
				return nil, errors.Join(ErrNotAcquired, ctx.Err(), err)
			}
			return nil, err
		}
		queued = true
		if l.waiter != nil && wake == nil {
			// Subscribe first, then try again: a release between the
			// failed attempt and the subscription is not missed.
			if w, s, werr := l.waiter.Wait(ctx, key, req.Owner); werr == nil {
				wake, stop = w, s
				continue
			}
			// No notifications: poll.
		}
		sleep := backoff
		if wake != nil {
			sleep = l.opts.MaxBackoff // only a fallback: release wakes us
		} else if backoff < l.opts.MaxBackoff {
			backoff = min(2*backoff, l.opts.MaxBackoff)
		}
		if g.RetryAfter > 0 && g.RetryAfter < sleep {
			sleep = g.RetryAfter + time.Millisecond
		}
		sleep = jitter(sleep)
		if timer == nil {
			timer = time.NewTimer(sleep)
		} else {
			timer.Reset(sleep)
		}
		select {
		case <-wake:
		case <-timer.C:
		case <-ctx.Done():
			l.leave(ctx, queued, key, req.Owner)
			return nil, errors.Join(ErrNotAcquired, ctx.Err())
		}
	}
}

// leave takes a waiter that gave up out of the backend's queue.
func (l *Locker) leave(ctx context.Context, queued bool, key, owner string) {
	if !queued || l.waiter == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), l.opts.ReleaseTimeout)
	defer cancel()
	_ = l.waiter.Leave(ctx, key, owner) // best effort: the entry expires after WaitTTL anyway
}

// Do takes the lock with Acquire, runs fn with a context that is cancelled
// when fn returns or the lease is lost, and releases the lock. It returns
// fn's error, or the acquire error, or the lease's loss joined to fn's error
// when the lease ended while fn ran. If fn panics, the lock is released
// (and its renewal stopped) before the panic goes on.
func (l *Locker) Do(ctx context.Context, key string, ttl time.Duration, fn func(ctx context.Context, lease *Lease) error) error {
	lease, err := l.Acquire(ctx, key, ttl)
	if err != nil {
		return err
	}
	workCtx, cancel := context.WithCancelCause(ctx)
	stopAfter := context.AfterFunc(lease.Context(), func() { cancel(context.Cause(lease.Context())) })
	panicked := true
	defer func() {
		if panicked {
			stopAfter()
			cancel(nil)
			_ = lease.Release(ctx)
		}
	}()
	err = fn(workCtx, lease)
	panicked = false
	stopAfter()
	cancel(nil)
	lost := lease.Err()
	// Release even a lost lease: it is owner-checked, so harmless, and it
	// frees what the backend may still hold for it.
	rerr := lease.Release(ctx)
	if lost != nil {
		return errors.Join(err, lost)
	}
	if rerr != nil {
		return errors.Join(err, rerr)
	}
	return err
}

func check(key string, ttl time.Duration) (time.Duration, error) {
	if key == "" || len(key) > MaxKeyLen {
		return 0, fmt.Errorf("%w: length %d, want 1..%d bytes", ErrInvalidKey, len(key), MaxKeyLen)
	}
	if ttl < time.Millisecond {
		return 0, fmt.Errorf("%w: %v, want at least 1ms", ErrInvalidTTL, ttl)
	}
	return ttl.Truncate(time.Millisecond), nil
}

// newOwner returns 128 random bits, base64url: the owner token.
func newOwner() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails (Go 1.24+)
	return base64.RawURLEncoding.EncodeToString(b[:])
}

// jitter returns d scaled by a random factor in [0.5, 1.5).
func jitter(d time.Duration) time.Duration {
	return d/2 + mrand.N(d+1)
}
