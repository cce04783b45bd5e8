// Package lincheck checks recorded histories of lock operations for
// linearizability with github.com/anishathalye/porcupine: the Jepsen-style
// proof that a lock.Backend is a lock, not just a lock in the runs a unit
// test happens to try.
//
// # Histories
//
// A Recorder records operations from many goroutines. Each Op has the
// monotonic time it was called and the time it returned (nanoseconds since
// the recorder was made), the client (goroutine) that ran it, the lock key,
// the owner token of the lease it concerns, and its outcome:
//
//   - Acquire: TryAcquire or a blocking Acquire (or, through
//     Recorder.Backend, one Backend.Acquire attempt). OK with the fence
//     granted; NotAcquired; or Unknown (ErrUnavailable, a context error,
//     anything else: the attempt may or may not have taken the lock).
//   - Release: OK; NotHeld or Expired (refused: the owner does not hold
//     the lock; the two are not told apart, see below); or Unknown.
//     A "rogue" release (Recorder.RogueRelease) is Backend.Release with a
//     fresh random owner token that never held anything: a lock that
//     compares the owner must refuse it and change nothing.
//   - Write and Read: the holder's critical section. Each key has a plain
//     shared Register (one atomic int64, not protected by anything but the
//     lock under test). A holder writes its fence into it, pauses, and
//     reads it back before releasing, so that an overlapping holder is
//     observable: its write lands between the two.
//   - FencedWrite: the resource side. A FencedRegister refuses a write
//     whose fence is lower than the highest one it accepted (equal is
//     accepted, as the service's accounts do with "fence <= $fence"); it
//     is the in-process equivalent of that conditional UPDATE, atomic
//     under a mutex.
//
// # The exclusive model (every backend)
//
// A history is partitioned by (Op.Scope, Op.Key); each partition must be
// linearizable against this sequential specification, whose state is
// (holder, fence, reg, fenced), initially (none, 0, 0, 0):
//
//	Acquire → OK(f)        legal iff holder = none and f > fence;
//	                       then holder = owner, fence = f
//	Acquire → NotAcquired  legal (with StrictTry: iff holder ≠ none); no change
//	Acquire → Unknown      either no change, or (if holder = none) holder =
//	                       owner (a ghost no later operation names, when the
//	                       owner is unknown) with fence unchanged (a lower bound)
//	Release → OK           legal iff holder = owner; then holder = none
//	Release → NotHeld/Expired  legal iff holder ≠ owner; no change
//	Release → Unknown      either no change, or (if holder = owner) holder = none
//	Write(v)               legal iff holder = owner; then reg = v
//	Read → v               legal iff holder = owner and reg = v
//	FencedWrite(f) → accepted  legal iff holder = owner and f ≥ fenced; fenced = f
//	FencedWrite(f) → refused   legal iff holder = owner and f < fenced
//
// Linearizable means: there is one total order of all operations of the
// partition that respects real time (an operation that returned before
// another was called comes first) in which every step is legal. So, at
// every linearization point there is at most one holder, and every
// critical-section operation happens while its own lease is the one
// holding the lock (mutual exclusion per fencing epoch: the epoch of
// fence f runs from its Acquire to its Release, and no other epoch's
// operation falls inside it); fences strictly increase in lock order; a
// holder's read sees its own write (nobody wrote in between); a release
// never frees a lock its caller does not hold. Unknown outcomes are
// nondeterministic (porcupine's NondeterministicModel), so a timeout is
// never counted against the lock, whichever way it went. ErrExpired and
// ErrNotHeld are not told apart: both mean "refused, nothing changed",
// and backends differ in how precisely they can say which (XactBackend
// cannot see another process's advisory lock). StrictTry additionally
// requires that a refused TryAcquire linearizes while someone holds the
// lock; it is valid only for backends with neither waiter queues (memlock
// and redislock refuse a try on a free lock while blocked waiters are
// queued for it) nor split votes (redlock), or workloads of tries only.
//
// Operations that are legal no-ops in every state (a refused acquire
// without StrictTry; a refused release by an owner that was never granted
// the lock) are dropped before the search: removing them changes no
// verdict, and keeps the search small.
//
// Lease expiry is not modelled: tests use TTLs far longer than the run.
//
// # The fenced model (through package fallback)
//
// Behind fallback.Backend two holders of one lock on different backends
// are possible by design while the breaker switches (see its package
// documentation), so the exclusive model does not hold for the Locker's
// history there, and is not weakened for it. Instead, each underlying
// backend's own history (recorded with Recorder.Backend, one Scope per
// backend and per Redis process lifetime) must satisfy the exclusive
// model: every backend on its own is still a lock. And the Locker's
// history must satisfy the fenced model, whose state is (fence, fenced):
//
//	Acquire → OK(f)              legal iff f > fence; then fence = f
//	FencedWrite(f) → accepted    legal iff f ≥ fenced; then fenced = f
//	FencedWrite(f) → refused     legal iff f < fenced
//	anything else                legal, no change (dropped)
//
// That is: fences strictly increase in real-time order across the switch
// (an acquire that returned before another was called has the smaller
// fence, whichever backend granted either), and the resource's fence
// check, interleaved with them, never accepts a stale write: once a write
// of a lease L' was accepted, no write of a lease L whose acquire returned
// before L' was called can be accepted after it, because fence(L) <
// fence(L') ≤ fenced. The Locker's plain-register reads are recorded but
// not constrained there; FindEvidence counts the overlaps they saw.
// Fences of different backends compare only up to the skew between their
// servers' clocks (package fallback says so); the tests run every server
// on one host, so the model allows none.
//
// # The tests
//
// The package's tests run the exclusive model on memlock, redislock on the
// shared Redis (counter and clock fences), redlock over three redis-server
// processes of their own, sqllock's table on PostgreSQL, MySQL and SQLite,
// and sqllock's XactBackend: 12 to 16 clients, 3 keys, tries and blocking
// acquires mixed with rogue releases (StrictTry where it is valid). They
// run the fenced model through fallback.Backend (redislock on a
// redis-server of their own, sqllock on PostgreSQL) with Redis killed in
// the middle of the run and restarted empty, with every backend's own
// history under the exclusive model. And they show that the checker has
// teeth: broken toy locks (granting without checking, releasing without
// comparing the owner, reusing a fence, check-then-act) are all found not
// linearizable, and so are a fallback's counter fences going backwards
// after Redis comes back.
//
// # Using it
//
//	rec := lincheck.NewRecorder()
//	lease, err := rec.Acquire(ctx, client, locker, key, ttl)
//	... rec.Write(client, reg, lease); rec.Read(client, reg, lease); rec.Release(ctx, client, lease)
//	rep := lincheck.Check(rec.Ops(), lincheck.Options{Model: lincheck.Exclusive})
//	if rep.Result != porcupine.Ok { rep.Visualize(path) }
//
// Evidence gives plain-language witnesses (reads of another holder's
// write, holds that certainly overlapped, fences that went backwards in
// real time, stale writes accepted) for a failure message; it is a
// diagnostic, the verdict is porcupine's.
package lincheck
