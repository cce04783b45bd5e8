// Package rueidislock is the Redis backend of package lock on the caller's
// github.com/redis/rueidis client: a single node, Sentinel or Cluster
// (rueidis.Client, as rueidis.NewClient returns it).
//
// It speaks the same protocol as lock/redislock, the backend on go-redis:
// the same key and channel names, the same Lua scripts, the same values.
// Processes using either backend on one Redis (with the same Prefix)
// exclude each other on a key, and fences keep increasing across them.
//
// A try-acquire is one round trip, SET NX PX and INCR of the fence key
// sent together; release (compare-and-delete), refresh
// (compare-and-pexpire) and blocked acquires are Lua scripts, atomic on
// the server and safe to retry; EVALSHA falls back to EVAL when the server
// lost its script cache (restart, failover, SCRIPT FLUSH). All keys of one
// lock share a hash tag, so every script touches one Cluster slot.
// Concurrent calls are pipelined by rueidis itself (auto-pipelining);
// client-side caching is not used. Under heavy concurrency lock/redislock,
// whose batcher sends larger pipelines, makes somewhat more lock cycles per
// second (see bench/README.md); pick the backend that matches your client.
//
// Blocked Acquires queue in Redis in arrival order; a release publishes
// the token of the first waiter in line and wakes only it, within a round
// trip, with polling only as a fallback (a lock whose holder let its TTL
// run out goes to whoever asks first). While someone waits, the Backend
// holds one dedicated connection of the client's (from its blocking pool)
// for the subscriptions.
//
// It needs Redis 6.2 or later (SET ... GET, KEEPTTL).
//
// A single Redis node (or a Cluster with asynchronous replication) can lose
// an acknowledged lock on failover: treat this lock as a way to make
// duplicates cheap to turn away, and keep correctness in the database
// (fencing tokens, unique constraints, conditional updates).
//
// Keys: for a lock named K and the default prefix, Redis holds
// "onceguard:lock:{K}" (the owner token), "onceguard:lock:{K}:fence",
// "onceguard:lock:{K}:q" and "onceguard:lock:{K}:qx" (waiters), and
// publishes on "onceguard:lock:{K}:wake". Names containing '{' or '}' are
// hashed (SHA-256) into "onceguard:lock:#{hex}" so that the hash tag stays
// intact.
package rueidislock

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/redis/rueidis"

	"github.com/onceguard/onceguard/lock"
	"github.com/onceguard/onceguard/lock/internal/redisscript"
)

// Options configure a Backend. A nil *Options means all defaults.
type Options struct {
	// Prefix starts every Redis key and channel name. Default:
	// "onceguard:lock:". Use the same as lock/redislock processes that
	// should exclude these.
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
	// timed out is given back (an owner-checked release, bounded the same
	// way: a fallback waits up to twice Timeout). Default: 0, the
	// client's own ConnWriteTimeout (rueidis: 10 × Dialer.KeepAlive, 10s
	// by default); set it lower (e.g. 300ms) when a fallback should take
	// over quickly from a Redis that stopped answering.
	Timeout time.Duration

	// ClockFences makes every fence max(last + 1, the server's time in
	// µs), the rule of the memlock and sqllock backends, instead of one
	// more than the last (seeded from the clock once per FenceRetention).
	// Set it when fences from this backend are compared with fences from
	// another one (see lock/redislock's option of the same name). It costs
	// a script per try instead of two plain commands; the round trips stay
	// the same.
	ClockFences bool
}

// Backend implements lock.Backend and lock.Waiter on Redis through
// rueidis. It is safe for concurrent use and holds no goroutine or
// connection of its own while nobody is blocked in Acquire.
type Backend struct {
	client  rueidis.Client
	prefix  string
	fence   string // FenceRetention in ms
	clock   bool   // ClockFences
	timeout time.Duration
	subs    *subscriber
}

var (
	_ lock.Backend = (*Backend)(nil)
	_ lock.Waiter  = (*Backend)(nil)
)

// New returns a Backend on client with the given options (nil: defaults);
// lock.New makes a Locker of it. It sends nothing; client stays the
// caller's to configure and close.
func New(client rueidis.Client, opts *Options) *Backend {
	if client == nil {
		panic("rueidislock: New needs a client")
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
	b := &Backend{
		client:  client,
		prefix:  o.Prefix,
		fence:   strconv.FormatInt(max(o.FenceRetention.Milliseconds(), 1), 10),
		clock:   o.ClockFences,
		timeout: max(o.Timeout, 0),
	}
	b.subs = &subscriber{b: b, send: make(chan struct{}, 1)}
	return b
}

// The scripts, with the SHA-1 of each computed once; Exec sends EVALSHA
// and falls back to EVAL on NOSCRIPT.
var (
	scriptAcquire = rueidis.NewLuaScript(redisscript.Acquire)
	scriptRelease = rueidis.NewLuaScript(redisscript.Release)
	scriptRefresh = rueidis.NewLuaScript(redisscript.Refresh)
	scriptLeave   = rueidis.NewLuaScript(redisscript.Leave)
	scriptRaise   = rueidis.NewLuaScript(redisscript.Raise)
	scriptReseed  = rueidis.NewLuaScript(redisscript.Reseed)
)

// name returns the Redis name of key's lock with suffix appended, and the
// lock's own key, which starts it (one allocation for both).
func (b *Backend) name(key, suffix string) (name, lockKey string) {
	name, n := redisscript.NameAndLock(b.prefix, key, suffix)
	return name, name[:n]
}

// queueKeys returns the lock, waiter queue and waiters' deadlines of key,
// the keys of the release and leave scripts. It returns an array, which
// stays on the caller's stack (Lua.Exec copies the keys): only the name
// is allocated.
func (b *Backend) queueKeys(key string) [3]string {
	deadlines, lockKey := b.name(key, redisscript.DeadlinesSuffix)
	return [3]string{lockKey, deadlines[:len(lockKey)+len(redisscript.QueueSuffix)], deadlines}
}

func noop() {}

// roundTrip returns the context of one round trip: detached from the
// caller's cancellation (a sent call is waited for) and bounded by
// Options.Timeout when set.
func (b *Backend) roundTrip(ctx context.Context) (context.Context, context.CancelFunc) {
	if _, dl := ctx.Deadline(); dl || ctx.Done() != nil { // else nothing ends it already: no allocation
		ctx = context.WithoutCancel(ctx)
	}
	if b.timeout > 0 {
		return context.WithTimeout(ctx, b.timeout)
	}
	return ctx, noop
}

// exec runs s on keys and args and returns its integer reply.
func (b *Backend) exec(ctx context.Context, s *rueidis.Lua, keys, args []string) (int64, error) {
	ctx, cancel := b.roundTrip(ctx)
	defer cancel()
	return s.Exec(ctx, b.client, keys, args).AsInt64()
}

// Acquire implements lock.Backend.
//
// A try (r.Wait false) is two plain commands sent together, SET NX PX and
// INCR of the fence key, which cost Redis a fraction of a script: the INCR
// runs right after the SET on the same connection, before this caller can
// release, so a later holder's INCR is always larger. An INCR after a
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
	fenceKey, lockKey := b.name(r.Key, redisscript.FenceSuffix)
	c := b.client.B()
	rctx, cancel := b.roundTrip(ctx)
	res := b.client.DoMulti(rctx,
		c.Set().Key(lockKey).Value(r.Owner).Nx().PxMilliseconds(r.TTL.Milliseconds()).Build(),
		c.Incr().Key(fenceKey).Build())
	cancel()
	if err := res[0].Error(); rueidis.IsRedisNil(err) {
		return lock.Grant{}, fmt.Errorf("rueidislock: acquire %q: %w", r.Key, lock.ErrNotAcquired)
	} else if err != nil {
		b.giveBack(ctx, r.Key, r.Owner, err)
		return lock.Grant{}, wrap("acquire", r.Key, err)
	}
	fence, err := res[1].AsInt64()
	if err == nil && fence < redisscript.ReseedBelow {
		// An unseeded fence key (first use, FenceRetention since it was
		// seeded, or a reseed that failed): seed it from the server's
		// clock, above every fence the key had before.
		fence, err = b.exec(ctx, scriptReseed, []string{fenceKey}, []string{b.fence})
	}
	if err != nil || fence <= 0 {
		// We hold the lock but have no fence: give it back.
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), max(b.timeout, redisscript.GiveBackTimeout))
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
	fenceKey, lockKey := b.name(r.Key, redisscript.FenceSuffix)
	deadlines, _ := b.name(r.Key, redisscript.DeadlinesSuffix)
	queue := deadlines[:len(lockKey)+len(redisscript.QueueSuffix)]
	n, err := b.exec(ctx, scriptAcquire, []string{lockKey, fenceKey, queue, deadlines},
		[]string{r.Owner, strconv.FormatInt(r.TTL.Milliseconds(), 10), b.fence, strconv.FormatInt(wait, 10)})
	if err != nil {
		b.giveBack(ctx, r.Key, r.Owner, err)
		return lock.Grant{}, wrap("acquire", r.Key, err)
	}
	if n > 0 {
		return lock.Grant{Fence: n}, nil
	}
	g := lock.Grant{RetryAfter: time.Duration(-1-n) * time.Millisecond}
	return g, fmt.Errorf("rueidislock: acquire %q: %w", r.Key, lock.ErrNotAcquired)
}

// giveBack releases a lock that an acquire whose answer was lost (err:
// its round trip timed out or its connection broke after it was sent) may
// have taken for owner. The release compares the owner, so it never
// removes another holder's lock; an error Redis answered took nothing.
func (b *Backend) giveBack(ctx context.Context, key, owner string, err error) {
	if _, ok := rueidis.IsRedisErr(err); ok {
		return
	}
	d := redisscript.GiveBackTimeout
	if b.timeout > 0 {
		d = b.timeout // a fallback is waiting for this answer
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), d)
	defer cancel()
	_ = b.Release(rctx, key, owner)
}

// Release implements lock.Backend.
func (b *Backend) Release(ctx context.Context, key, owner string) error {
	keys := b.queueKeys(key)
	n, err := b.execOwned(ctx, scriptRelease, keys[:], []string{owner})
	return result("release", key, n, err)
}

// Refresh implements lock.Backend.
func (b *Backend) Refresh(ctx context.Context, key, owner string, ttl time.Duration) error {
	_, lockKey := b.name(key, "")
	n, err := b.execOwned(ctx, scriptRefresh, []string{lockKey}, []string{owner, strconv.FormatInt(ttl.Milliseconds(), 10)})
	return result("refresh", key, n, err)
}

// execOwned runs a script that compares the lock's owner (release,
// refresh), and again (twice at most, 20 and 40 ms apart) when the
// connection it went out on was found broken (a Redis restart or failover
// breaks every connection; rueidis retries only read-only commands). Comparing by owner makes that
// safe: run twice, the second answers what Redis holds after the first.
func (b *Backend) execOwned(ctx context.Context, s *rueidis.Lua, keys, args []string) (int64, error) {
	n, err := b.exec(ctx, s, keys, args)
	for try := 1; try < 3 && err != nil && brokenConn(err); try++ {
		select { // a moment for the client to reconnect
		case <-ctx.Done():
			return n, err
		case <-time.After(time.Duration(try) * 20 * time.Millisecond):
		}
		n, err = b.exec(ctx, s, keys, args)
	}
	return n, err
}

// brokenConn reports an error of a connection that broke, not of Redis
// or of a deadline.
func brokenConn(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, net.ErrClosed) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}

// Wait implements lock.Waiter: it subscribes to the lock's channel.
func (b *Backend) Wait(ctx context.Context, key, owner string) (<-chan struct{}, func(), error) {
	ch, _ := b.name(key, redisscript.WakeSuffix)
	wake, stop, err := b.subs.wait(ctx, ch, owner)
	if err != nil {
		return nil, nil, wrap("wait", key, err)
	}
	return wake, stop, nil
}

// Leave implements lock.Waiter.
func (b *Backend) Leave(ctx context.Context, key, owner string) error {
	keys := b.queueKeys(key)
	if _, err := b.exec(ctx, scriptLeave, keys[:], []string{owner}); err != nil {
		return wrap("leave", key, err)
	}
	return nil
}

// RaiseFence makes the next fence of key larger than floor, like
// redislock.Backend.RaiseFence: after a quorum acquire over independent
// nodes, raising every granting node to the largest fence any of them
// returned keeps fences increasing across quorums.
func (b *Backend) RaiseFence(ctx context.Context, key string, floor int64) error {
	fenceKey, _ := b.name(key, redisscript.FenceSuffix)
	if _, err := b.exec(ctx, scriptRaise, []string{fenceKey}, []string{strconv.FormatInt(floor, 10), b.fence}); err != nil {
		return wrap("raise fence", key, err)
	}
	return nil
}

// result maps the reply of the release and refresh scripts.
func result(op, key string, n int64, err error) error {
	if err != nil {
		return wrap(op, key, err)
	}
	if e, ok := redisscript.Outcome(n); ok {
		if e == nil {
			return nil
		}
		return fmt.Errorf("rueidislock: %s %q: %w", op, key, e)
	}
	return fmt.Errorf("rueidislock: %s %q: unexpected reply %d", op, key, n)
}

// wrap adds lock.ErrUnavailable to errors that mean Redis could not be
// reached or could not answer now, so that fallback lockers can switch.
func wrap(op, key string, err error) error {
	if unavailable(err) {
		return fmt.Errorf("rueidislock: %s %q: %w: %w", op, key, lock.ErrUnavailable, err)
	}
	return fmt.Errorf("rueidislock: %s %q: %w", op, key, err)
}

func unavailable(err error) bool {
	if rerr, ok := rueidis.IsRedisErr(err); ok {
		return redisscript.NotNow(rerr.Error())
	}
	var nerr net.Error
	return errors.As(err, &nerr) ||
		errors.Is(err, context.DeadlineExceeded) ||
		errors.Is(err, rueidis.ErrClosing) ||
		errors.Is(err, rueidis.ErrNoSlot) ||
		errors.Is(err, net.ErrClosed) ||
		errors.Is(err, io.EOF) ||
		errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNREFUSED) ||
		errors.Is(err, syscall.ECONNRESET) ||
		errors.Is(err, syscall.EPIPE) ||
		strings.Contains(err.Error(), "connection refused")
}
