package app

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/onceguard/onceguard/lock"
)

// The lock names: a user's lock serialises their withdrawals, an order's its payments.
func userLock(userID string) string   { return "user:" + userID }
func orderLock(orderID string) string { return "order:" + orderID }

// lockWait bounds how long a waiting acquire blocks.
const lockWait = 5 * time.Second

// staleFenceAttempts is how many leases a write refused for a stale fence gets.
const staleFenceAttempts = 3

// errLock wraps a failure to take a resource's lock.
var errLock = errors.New("app: lock not had")

// LockResult is an acquire's result as a metric counts it: acquired, busy, unavailable or error.
func LockResult(err error) string {
	switch {
	case err == nil:
		return "acquired"
	case errors.Is(err, lock.ErrUnavailable):
		return "unavailable"
	case errors.Is(err, lock.ErrNotAcquired):
		return "busy"
	default:
		return "error"
	}
}

// underLock runs write holding the lock on key (waiting up to lockWait when wait, else one try)
// with the lease's fence, and releases it. A write refused for a stale fence changed nothing
// (two holders overlapped, the older one second) and runs again under a new lease, so that a
// switch between lock backends does not fail requests. A lock not had is errLock joined with
// the locker's error.
func (s *Service) underLock(ctx context.Context, key string, wait bool, write func(fence int64) error) error {
	locks, ttl := s.cfg.Locks, s.cfg.LockTTL
	for attempt := 1; ; attempt++ {
		var (
			lease *lock.Lease
			err   error
		)
		if wait {
			wctx, cancel := context.WithTimeout(ctx, lockWait)
			lease, err = locks.Acquire(wctx, key, ttl)
			cancel()
		} else {
			lease, err = locks.TryAcquire(ctx, key, ttl)
		}
		if err != nil {
			if !errors.Is(err, lock.ErrNotAcquired) {
				s.lockLog(ctx).Warn("lock acquire failed", "lock", key, "result", LockResult(err), "error", err.Error())
			}
			return errors.Join(errLock, err)
		}
		held := time.Now()
		err = write(lease.Fence())
		rerr := lease.Release(ctx)
		switch lost := lease.Err(); {
		case lost == nil:
		case errors.Is(lost, lock.ErrNotHeld):
			// The lease ended while held; the fence refused the write if another holder came in between.
			s.lockLog(ctx).Warn("lock lost", "lock", key, "held_ms", time.Since(held).Milliseconds(), "cause", lost.Error())
		default:
			// The release did not reach the backend: not lost, but held there until its TTL passes.
			cause := lost
			if rerr != nil {
				cause = rerr
			}
			s.lockLog(ctx).Warn("lock release failed", "lock", key, "held_ms", time.Since(held).Milliseconds(), "result", LockResult(cause),
				"cause", cause.Error(), "expires_within", ttl.String())
		}
		if !errors.Is(err, ErrStaleFence) || attempt == staleFenceAttempts {
			return err
		}
		s.logger(ctx).Info("stale fence: the write was refused and is retried under a new lease", "lock", key, "attempt", attempt)
	}
}

// lockLog is the request's logger for a lock line, naming the backend serving now.
func (s *Service) lockLog(ctx context.Context) *slog.Logger {
	l := s.logger(ctx)
	if s.cfg.LockBackend != nil {
		l = l.With("backend", s.cfg.LockBackend())
	}
	return l
}
