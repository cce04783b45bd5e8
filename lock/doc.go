// Package lock is a distributed lock with owner tokens, fencing tokens,
// renewal and a lost-lease signal, over pluggable backends.
//
// A Locker (New) hands out Leases on named locks kept by a Backend:
// memlock (in process), redislock (Redis, Sentinel or Cluster, on your
// go-redis client), and the database and quorum backends of the sibling
// packages. The core package uses only the standard library.
//
//	locker := lock.New(redislock.New(rdb, nil), nil)
//	lease, err := locker.Acquire(ctx, "user:42", 10*time.Second)
//	if err != nil {
//		return err // errors.Is(err, lock.ErrNotAcquired) when the wait ended
//	}
//	defer lease.Release(ctx) // on a detached context: safe after cancellation
//	// ... work, stopping when <-lease.Done() ...
//
// # Guarantees
//
// Release and Refresh compare the owner token on the server, so they never
// delete or extend someone else's lock, and retrying them is safe. A lease
// ends locally slightly before its TTL (a drift margin), and its Done
// channel and Context say so at once; with Options.AutoRenew a timer
// refreshes it every TTL/3 and ends it as soon as a refresh finds the lock
// gone.
//
// # Fencing
//
// No lock can stop a holder that was paused (GC, a stalled VM) past its TTL
// from waking up and writing after the next holder took over. The fencing
// token (Lease.Fence) closes that gap: it strictly increases with every
// acquire of a key, so the resource can refuse a write whose fence is lower
// than the last one it accepted, for example in SQL:
//
//	UPDATE accounts SET balance = balance - $1, fence = $2
//	WHERE user_id = $3 AND fence < $2 AND balance >= $1
//
// Fences are seeded from the backend server's clock in microseconds and
// then increase by at least one per acquire (see each backend). Unlike
// plain counters they keep increasing when a Redis restart loses the
// counter. Fences of different backends are only roughly comparable: when
// a fallback moves a lock between Redis and a database, a fence that must
// stay monotonic belongs to the resource itself (a version column the
// database advances with every write).
//
// The reference service treats locks as the fast path only: correctness
// lives in the database (unique constraints, conditional updates, the
// fence column), so an expired lock or a lost Redis can cost a retry, never
// a second movement of money.
//
// # Errors
//
// Every backend returns (wrapped) ErrNotAcquired, ErrNotHeld, ErrExpired,
// ErrInvalidKey, ErrInvalidTTL and ErrUnavailable, so errors.Is works
// whatever the backend. A blocking Acquire that ends with its context
// returns errors.Join(ErrNotAcquired, ctx.Err()).
package lock
