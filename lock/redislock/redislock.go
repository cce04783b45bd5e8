// Package redislock is the Redis backend of package lock, on the caller's
// go-redis client: a single node, Sentinel or Cluster
// (redis.UniversalClient).
//
// A try-acquire is SET NX PX and INCR of the lock's fence key, sent
// together; release (compare-and-delete), refresh (compare-and-pexpire)
// and blocked acquires are Lua scripts, atomic on the server and safe to
// retry; EVALSHA falls back to EVAL when the server lost its script cache
// (restart, failover, SCRIPT FLUSH). All keys of one lock share a hash
// tag, so every script touches one Cluster slot. Concurrent calls are
// pipelined over the caller's client (see Options.MaxInflight), which is
// what makes this backend fast under load. lock/rueidislock speaks the
// same protocol on a rueidis client: processes using either exclude each
// other.
//
// Hooks on the client see every command the backend sends. Their
// arguments live in storage the backend reuses once the call has
// returned: a hook that keeps a command to read its arguments later (an
// asynchronous exporter) must format them (Cmd.String, or fmt.Sprint of
// each of Cmd.Args) before its ProcessHook or ProcessPipelineHook returns:
// a copy of the Args slice still points into that storage.
//
// Blocked Acquires queue in Redis in arrival order; a release publishes the
// token of the first waiter in line and wakes only it, within a round trip,
// with polling only as a fallback. The queue orders releases' hand-overs: a
// lock whose holder let its TTL run out (a crashed holder) goes to whoever
// asks first, a try or a waiter's next attempt.
//
// It needs Redis 6.2 or later (SET ... GET, KEEPTTL).
//
// A single Redis node (or a Cluster with asynchronous replication) can lose
// an acknowledged lock on failover: treat this lock as a way to make
// duplicates cheap to turn away, and keep correctness in the database
// (fencing tokens, unique constraints, conditional updates). Fences order
// the holders across a failover only with Options.ClockFences: a counter
// goes back with the primary that lost it.
//
// Keys: for a lock named K and the default prefix, Redis holds
// "onceguard:lock:{K}" (the owner token), "onceguard:lock:{K}:fence",
// "onceguard:lock:{K}:q" and "onceguard:lock:{K}:qx" (waiters), and
// publishes on "onceguard:lock:{K}:wake". Names containing '{' or '}' are
// hashed (SHA-256) into "onceguard:lock:#{hex}" so that the hash tag stays
// intact.
package redislock

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/onceguard/onceguard/lock"
	"github.com/onceguard/onceguard/lock/internal/redisscript"
)

// Options configure a Backend. A nil *Options means all defaults.
type Options struct {
	// Prefix starts every Redis key and channel name. Default:
	// "onceguard:lock:".
	Prefix string

	// FenceRetention is how long a key's fence record lives after it was
	// seeded from the server's clock. Fences are seeded from server
	// microseconds and then increase by at least one per acquire, so they
	// keep increasing after the record is gone (or Redis lost it) unless
	// the server's clock steps back by more than this; a new record costs
	// one more round trip on its first acquire. Default: 24h.
	FenceRetention time.Duration

	// Timeout bounds each round trip to Redis, whatever the caller's
	// context: a call that has been sent is always waited for, so that a
	// lock taken on the way is never lost track of, and an acquire that
	// timed out is given back (owner-checked). It bounds socket reads and
	// writes only on a client with ContextTimeoutEnabled; otherwise only
	// the client's ReadTimeout and WriteTimeout do. Default: 0, the
	// client's own ReadTimeout and WriteTimeout (go-redis: 3s); set it when
	// those are disabled, or lower (e.g. 300ms) when a fallback should take
	// over quickly from a Redis that stopped answering.
	Timeout time.Duration

	// MaxInflight is how many pipelines may be in flight at once; calls
	// arriving while all are busy wait and go out together in the next
	// one. 1 disables concurrency between pipelines, not pipelining.
	// Default: 4.
	MaxInflight int

	// MaxBatch caps the calls in one pipeline. Default: 256.
	MaxBatch int

	// ClockFences makes every fence max(last + 1, the server's time in
	// µs), the rule of the memlock and sqllock backends, instead of one
	// more than the last (seeded from the clock once per FenceRetention).
	// Set it when fences from this backend are compared with fences from
	// another one: behind package fallback, the database grants
	// clock-based fences while Redis is away, and a resource that accepted
	// one would refuse every later counter-based fence as stale; and when
	// Redis fails over to a replica that had not seen the last grants, a
	// counter goes back, a clock does not. It costs
	// a script per try instead of two plain commands (about a quarter of
	// the try throughput); the round trips stay the same.
	ClockFences bool
}

// Backend implements lock.Backend and lock.Waiter on Redis. It is safe for
// concurrent use and holds no goroutine or connection of its own while
// nobody is blocked in Acquire.
type Backend struct {
	prefix string
	fence  string // FenceRetention in ms
	clock  bool   // ClockFences
	batch  *batcher
	subs   *subscriber
}

var (
	_ lock.Backend = (*Backend)(nil)
	_ lock.Waiter  = (*Backend)(nil)
)

// New returns a Backend on rdb with the given options (nil: defaults);
// lock.New makes a Locker of it. It does not dial; rdb stays the caller's
// to configure and close.
func New(rdb redis.UniversalClient, opts *Options) *Backend {
	if rdb == nil {
		panic("redislock: New needs a client")
	}
	var o Options
	if opts != nil {
		o = *opts
	}
	if o.Prefix == "" {
		o.Prefix = redisscript.DefaultPrefix
	}
	if o.FenceRetention <= 0 {
		o.FenceRetention = redisscript.DefaultFenceRetention
	}
	if o.MaxInflight <= 0 {
		o.MaxInflight = 4
	}
	if o.MaxBatch <= 0 {
		o.MaxBatch = 256
	}
	return &Backend{
		prefix: o.Prefix,
		fence:  strconv.FormatInt(max(o.FenceRetention.Milliseconds(), 1), 10),
		clock:  o.ClockFences,
		batch:  &batcher{rdb: rdb, maxBatch: o.MaxBatch, maxInflight: o.MaxInflight, timeout: o.Timeout},
		subs:   &subscriber{rdb: rdb},
	}
}

// Suffixes of a lock's Redis names (see package redisscript): for a lock
// key L, its fence is L + fenceSuffix, its waiter queue L + queueSuffix,
// the waiters' deadlines L + deadlinesSuffix and its channel L + wakeSuffix.
const (
	fenceSuffix     = redisscript.FenceSuffix
	queueSuffix     = redisscript.QueueSuffix
	deadlinesSuffix = redisscript.DeadlinesSuffix // queueSuffix is a prefix of it
	wakeSuffix      = redisscript.WakeSuffix
)

// appendName appends to dst the Redis name of key's lock with suffix
// appended, and returns it with the length of the lock's own key, "P{K}"
// for prefix P and tag K, which starts it.
func (b *Backend) appendName(dst []byte, key, suffix string) ([]byte, int) {
	return redisscript.AppendName(dst, b.prefix, key, suffix)
}

// name returns the Redis name of key's lock with suffix appended.
func (b *Backend) name(key, suffix string) string {
	return redisscript.Name(b.prefix, key, suffix)
}

// run sends the script run c was made (call.eval) and returns its reply.
func (b *Backend) run(ctx context.Context, c *call) (any, error) {
	b.batch.do(ctx, c)
	res, err := c.cmds[0].(*redis.Cmd).Result()
	b.batch.put(c)
	return res, err
}

// Acquire implements lock.Backend.
//
// A try (r.Wait false) is two plain commands sent back to back, SET NX PX
// and INCR of the fence key, which cost Redis a fraction of a script: the
// INCR runs right after the SET on the same connection, before this caller
// can release, so a later holder's INCR is always larger. An INCR after a
// failed SET only skips a number. When the INCR finds the fence key
// unseeded (it created it, or the seed after its creation failed: see
// redisscript.ReseedBelow), one more script seeds it from the server's
// clock (once per key per FenceRetention). A blocked waiter runs the acquire script, which also
// manages the queue and sets the fence to max(last + 1, server µs); with
// ClockFences, tries run that script too.
func (b *Backend) Acquire(ctx context.Context, r lock.Request) (lock.Grant, error) {
	if r.Wait || b.clock {
		return b.acquireScript(ctx, r)
	}
	c := b.batch.get()
	i, lockEnd, fenceEnd := c.name(b, r.Key, fenceSuffix)
	fenceKey := c.arg(i, fenceEnd)
	set := redis.NewStatusCmd(ctx, c.list("set", c.arg(i, lockEnd), c.text(r.Owner), "nx", "px", c.int(r.TTL.Milliseconds()))...)
	incr := redis.NewIntCmd(ctx, c.list("incr", fenceKey)...)
	c.command(set)
	c.command(incr)
	b.batch.do(ctx, c)
	b.batch.put(c)
	if err := set.Err(); err == redis.Nil {
		// Taken: by another owner, or by this very try when the client
		// sent the pipeline again after a broken connection (go-redis's
		// MaxRetries) and its first SET had run. Then it is ours, and this
		// INCR, after that SET, its fence.
		if !b.heldBy(ctx, r.Key, r.Owner) {
			return lock.Grant{}, fmt.Errorf("redislock: acquire %q: %w", r.Key, lock.ErrNotAcquired)
		}
	} else if err != nil {
		b.giveBack(ctx, r.Key, r.Owner, err)
		return lock.Grant{}, wrap("acquire", r.Key, err)
	}
	fence, err := incr.Result()
	if err == nil && fence < redisscript.ReseedBelow {
		// An unseeded fence key (first use, FenceRetention since it was
		// seeded, or a reseed that failed): seed it from the server's
		// clock, above every fence the key had before.
		c := b.batch.get()
		i, _, fenceEnd := c.name(b, r.Key, fenceSuffix)
		c.eval(ctx, scriptReseed, 1, c.arg(i, fenceEnd), c.text(b.fence))
		var res any
		if res, err = b.run(ctx, c); err == nil {
			fence, _ = res.(int64)
		}
	}
	if err != nil || fence <= 0 {
		// We hold the lock but have no fence: give it back.
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), max(b.batch.timeout, redisscript.GiveBackTimeout))
		defer cancel()
		_ = b.Release(rctx, r.Key, r.Owner)
		return lock.Grant{}, wrap("acquire", r.Key, fmt.Errorf("fence: %v (%w)", fence, err))
	}
	return lock.Grant{Fence: fence}, nil
}

func (b *Backend) acquireScript(ctx context.Context, r lock.Request) (lock.Grant, error) {
	wait := int64(0) // a try: never joins the queue
	if r.Wait {
		wait = max(r.WaitTTL.Milliseconds(), 1)
	}
	c := b.batch.get()
	i, lockEnd, fenceEnd := c.name(b, r.Key, fenceSuffix)
	j, _, deadlinesEnd := c.name(b, r.Key, deadlinesSuffix)
	queueEnd := deadlinesEnd - len(deadlinesSuffix) + len(queueSuffix)
	c.eval(ctx, scriptAcquire, 4, c.arg(i, lockEnd), c.arg(i, fenceEnd), c.arg(j, queueEnd), c.arg(j, deadlinesEnd),
		c.text(r.Owner), c.int(r.TTL.Milliseconds()), c.text(b.fence), c.int(wait))
	res, err := b.run(ctx, c)
	if err != nil {
		b.giveBack(ctx, r.Key, r.Owner, err)
		return lock.Grant{}, wrap("acquire", r.Key, err)
	}
	n, ok := res.(int64)
	if !ok {
		return lock.Grant{}, fmt.Errorf("redislock: acquire %q: unexpected reply %v", r.Key, res)
	}
	if n > 0 {
		return lock.Grant{Fence: n}, nil
	}
	g := lock.Grant{RetryAfter: time.Duration(-1-n) * time.Millisecond}
	return g, fmt.Errorf("redislock: acquire %q: %w", r.Key, lock.ErrNotAcquired)
}

// heldBy reports whether key's lock holds owner (with or without the
// waiters' mark); false when that cannot be read.
func (b *Backend) heldBy(ctx context.Context, key, owner string) bool {
	c := b.batch.get()
	i, lockEnd, _ := c.name(b, key, fenceSuffix)
	get := redis.NewStringCmd(ctx, c.list("get", c.arg(i, lockEnd))...)
	c.command(get)
	b.batch.do(ctx, c)
	b.batch.put(c)
	v, err := get.Result()
	return err == nil && (v == owner || v == owner+"\n")
}

// giveBack releases a lock that an acquire whose answer was lost (err:
// its round trip timed out or its connection broke after it was sent) may
// have taken for owner. The release compares the owner, so it never
// removes another holder's lock; an error Redis answered took nothing.
func (b *Backend) giveBack(ctx context.Context, key, owner string, err error) {
	var rerr redis.Error
	if errors.As(err, &rerr) {
		return
	}
	d := redisscript.GiveBackTimeout
	if b.batch.timeout > 0 {
		d = b.batch.timeout // a fallback is waiting for this answer
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), d)
	defer cancel()
	_ = b.Release(rctx, key, owner)
}

// queueScript makes c a run of s (release or leave) on key's lock, waiter
// queue and waiters' deadlines, for owner.
func (b *Backend) queueScript(ctx context.Context, c *call, s *script, key, owner string) {
	i, lockEnd, deadlinesEnd := c.name(b, key, deadlinesSuffix)
	c.eval(ctx, s, 3, c.arg(i, lockEnd), c.arg(i, lockEnd+len(queueSuffix)), c.arg(i, deadlinesEnd), c.text(owner))
}

// Release implements lock.Backend.
func (b *Backend) Release(ctx context.Context, key, owner string) error {
	c := b.batch.get()
	b.queueScript(ctx, c, scriptRelease, key, owner)
	res, err := b.run(ctx, c)
	return result("release", key, res, err)
}

// Refresh implements lock.Backend.
func (b *Backend) Refresh(ctx context.Context, key, owner string, ttl time.Duration) error {
	c := b.batch.get()
	i, _, lockEnd := c.name(b, key, "")
	c.eval(ctx, scriptRefresh, 1, c.arg(i, lockEnd), c.text(owner), c.int(ttl.Milliseconds()))
	res, err := b.run(ctx, c)
	return result("refresh", key, res, err)
}

// Wait implements lock.Waiter: it subscribes to the lock's channel.
func (b *Backend) Wait(ctx context.Context, key, owner string) (<-chan struct{}, func(), error) {
	wake, stop, err := b.subs.wait(ctx, b.name(key, wakeSuffix), owner)
	if err != nil {
		return nil, nil, wrap("wait", key, err)
	}
	return wake, stop, nil
}

// Leave implements lock.Waiter.
func (b *Backend) Leave(ctx context.Context, key, owner string) error {
	c := b.batch.get()
	b.queueScript(ctx, c, scriptLeave, key, owner)
	_, err := b.run(ctx, c)
	if err != nil {
		return wrap("leave", key, err)
	}
	return nil
}

// RaiseFence makes the next fence of key larger than floor. Package redlock
// uses it to keep fences increasing across quorums of independent nodes:
// after a quorum acquire it raises every granting node to the largest fence
// any of them returned, and any later quorum shares at least one of them.
func (b *Backend) RaiseFence(ctx context.Context, key string, floor int64) error {
	c := b.batch.get()
	i, _, fenceEnd := c.name(b, key, fenceSuffix)
	c.eval(ctx, scriptRaise, 1, c.arg(i, fenceEnd), c.int(floor), c.text(b.fence))
	if _, err := b.run(ctx, c); err != nil {
		return wrap("raise fence", key, err)
	}
	return nil
}

func result(op, key string, res any, err error) error {
	if err != nil {
		return wrap(op, key, err)
	}
	if n, isInt := res.(int64); isInt {
		if e, ok := redisscript.Outcome(n); ok {
			if e == nil {
				return nil
			}
			return fmt.Errorf("redislock: %s %q: %w", op, key, e)
		}
	}
	return fmt.Errorf("redislock: %s %q: unexpected reply %v", op, key, res)
}

// wrap adds lock.ErrUnavailable to errors that mean Redis could not be
// reached or could not answer now, so that fallback lockers can switch.
func wrap(op, key string, err error) error {
	if unavailable(err) {
		return fmt.Errorf("redislock: %s %q: %w: %w", op, key, lock.ErrUnavailable, err)
	}
	return fmt.Errorf("redislock: %s %q: %w", op, key, err)
}

func unavailable(err error) bool {
	var rerr redis.Error
	if errors.As(err, &rerr) {
		return redisscript.NotNow(rerr.Error())
	}
	var nerr net.Error
	return errors.As(err, &nerr) ||
		errors.Is(err, context.DeadlineExceeded) ||
		errors.Is(err, redis.ErrClosed) ||
		errors.Is(err, redis.ErrPoolTimeout) ||
		errors.Is(err, net.ErrClosed) ||
		strings.Contains(err.Error(), "connection refused") ||
		strings.Contains(err.Error(), "EOF")
}
