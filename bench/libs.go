package main

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	bsmlock "github.com/bsm/redislock"
	"github.com/go-redsync/redsync/v4"
	"github.com/go-redsync/redsync/v4/redis/goredis/v9"
	"github.com/redis/go-redis/v9"
	"github.com/redis/rueidis"

	"github.com/onceguard/onceguard/lock"
	oglock "github.com/onceguard/onceguard/lock/redislock"
	ogrueidis "github.com/onceguard/onceguard/lock/rueidislock"
)

// A worker is one goroutine's handle on one lock key of one library. It
// holds at most one lock at a time and is used by one goroutine only.
type worker interface {
	// try makes one attempt; false (and a nil error) means the lock is held
	// by someone else.
	try(ctx context.Context) (bool, error)
	// block waits for the lock with the library's default blocking
	// behaviour (see the README for the settings), bounded by ctx.
	block(ctx context.Context) error
	// unlock releases what try or block took.
	unlock(ctx context.Context) error
}

// library is one lock implementation under test, on its own client.
type library struct {
	name      string
	group     string // the scenarios it runs: groupRedis or groupBackends
	newWorker func(key string) worker
	// serverCPU returns the CPU time (user+sys) the lock's server used so
	// far; nil when there is no server process (SQLite runs in the bench).
	serverCPU func() (time.Duration, bool)
	// cleanup deletes every lock record whose name starts with prefix and
	// returns how many of them were locks still held.
	cleanup func(ctx context.Context, prefix string) (held int64, err error)
	close   func()
	// blockingOnly: the library runs only the blocking scenarios (its try
	// is another library's).
	blockingOnly bool
	// tryOnly: the library has no blocking acquire (the minimal designs)
	// and skips the blocking scenarios.
	tryOnly bool
	// serverCmds returns how many commands the lock's server has
	// processed so far (Redis: INFO stats total_commands_processed); nil
	// when not known.
	serverCmds func() (int64, bool)
}

// clientOptions is the one go-redis configuration every library gets (a
// fresh redis.NewClient each, so none shares another's pool).
func clientOptions(addr string) *redis.Options {
	return &redis.Options{Addr: addr} // everything else default: PoolSize 10*GOMAXPROCS, ...
}

// newRedisLibraries returns the libraries of the Redis group, each on its
// own client of the server at addr; admin (a client of its own) samples the
// server's CPU and cleans up after each cell.
func newRedisLibraries(addr string, admin *redis.Client) []*library {
	libs := []*library{newOnceguard(addr), newOnceguardRueidis(addr), newMinimalGoRedis(addr, false), newMinimalGoRedis(addr, true), newMinimalRueidis(addr, false), newMinimalRueidis(addr, true), newBSM(addr), newBSM1ms(addr), newRedsync(addr)}
	for _, l := range libs {
		l.group = groupRedis
		l.serverCPU = func() (time.Duration, bool) { return redisCPU(admin) }
		l.serverCmds = func() (int64, bool) { return redisCommands(admin) }
		l.cleanup = redisCleanup(admin)
	}
	return libs
}

// redisCleanup deletes the keys under a cell's prefix (SCAN + UNLINK of
// those keys only) and counts the lock keys among them: onceguard's fence
// records, kept by design for FenceRetention, and its waiter-queue records
// do not count.
func redisCleanup(admin *redis.Client) func(ctx context.Context, prefix string) (int64, error) {
	return func(ctx context.Context, prefix string) (int64, error) {
		var held int64
		var keys []string
		iter := admin.Scan(ctx, 0, "*"+prefix+"*", 1000).Iterator()
		for iter.Next(ctx) {
			k := iter.Val()
			keys = append(keys, k)
			if !strings.HasSuffix(k, ":fence") && !strings.HasSuffix(k, ":q") && !strings.HasSuffix(k, ":qx") { // minimal-rueidis+fence's counters end in ":fence" too
				held++
			}
		}
		err := iter.Err()
		for c := range slices.Chunk(keys, 500) {
			err = errors.Join(err, admin.Unlink(ctx, c...).Err())
		}
		return held, err
	}
}

// --- onceguard lock/redislock, all defaults ---------------------------------

func newOnceguard(addr string) *library {
	rdb := redis.NewClient(clientOptions(addr))
	l := lock.New(oglock.New(rdb, nil), nil)
	return &library{name: "onceguard", close: func() { _ = rdb.Close() }, newWorker: func(key string) worker {
		return &ogWorker{l: l, key: key}
	}}
}

// --- onceguard lock/rueidislock, all defaults --------------------------------

// libOGRueidis is onceguard's Redis lock on a rueidis client (default
// client options: auto-pipelining over 2^PipelineMultiplex connections).
const libOGRueidis = "onceguard-rueidis"

func newOnceguardRueidis(addr string) *library {
	c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{addr}})
	if err != nil {
		// rueidis dials in NewClient; report it as every cycle's error.
		return &library{name: libOGRueidis, close: func() {}, newWorker: func(string) worker { return errWorker{err} }}
	}
	l := lock.New(ogrueidis.New(c, nil), nil)
	return &library{name: libOGRueidis, close: c.Close, newWorker: func(key string) worker {
		return &ogWorker{l: l, key: key}
	}}
}

// errWorker fails every operation with err.
type errWorker struct{ err error }

func (w errWorker) try(context.Context) (bool, error) { return false, w.err }
func (w errWorker) block(context.Context) error       { return w.err }
func (w errWorker) unlock(context.Context) error      { return w.err }

// ogWorker drives any onceguard *lock.Locker: the Redis backend here, and
// sqllock and redlock in the backends group.
type ogWorker struct {
	l     *lock.Locker
	key   string
	lease *lock.Lease
}

func (w *ogWorker) try(ctx context.Context) (bool, error) {
	lease, err := w.l.TryAcquire(ctx, w.key, cycleTTL)
	if errors.Is(err, lock.ErrNotAcquired) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	w.lease = lease
	return true, nil
}

func (w *ogWorker) block(ctx context.Context) error {
	lease, err := w.l.Acquire(ctx, w.key, cycleTTL)
	if err != nil {
		return err
	}
	w.lease = lease
	return nil
}

func (w *ogWorker) unlock(ctx context.Context) error {
	lease := w.lease
	w.lease = nil
	if lease == nil {
		return errors.New("onceguard: unlock without a lease")
	}
	return lease.Release(ctx)
}

// --- github.com/bsm/redislock v0.9.4 ----------------------------------------

func newBSM(addr string) *library {
	rdb := redis.NewClient(clientOptions(addr))
	c := bsmlock.New(rdb)
	// The blocking setting its README shows; the caller's context bounds it.
	blocking := &bsmlock.Options{RetryStrategy: bsmlock.LinearBackoff(100 * time.Millisecond)}
	return &library{name: "bsm/redislock", close: func() { _ = rdb.Close() }, newWorker: func(key string) worker {
		return &bsmWorker{c: c, key: key, blocking: blocking}
	}}
}

// libBSM1ms is bsm/redislock polling every millisecond when it blocks: the
// blocking handoffs compared with a tight poller, not only with the
// library's documented 100 ms retry.
const libBSM1ms = "bsm/redislock-1ms"

func newBSM1ms(addr string) *library {
	rdb := redis.NewClient(clientOptions(addr))
	c := bsmlock.New(rdb)
	blocking := &bsmlock.Options{RetryStrategy: bsmlock.LinearBackoff(time.Millisecond)}
	return &library{name: libBSM1ms, blockingOnly: true, close: func() { _ = rdb.Close() }, newWorker: func(key string) worker {
		return &bsmWorker{c: c, key: key, blocking: blocking}
	}}
}

type bsmWorker struct {
	c        *bsmlock.Client
	key      string
	blocking *bsmlock.Options
	lk       *bsmlock.Lock
}

func (w *bsmWorker) try(ctx context.Context) (bool, error) {
	lk, err := w.c.Obtain(ctx, w.key, cycleTTL, nil) // nil: NoRetry, one attempt
	if errors.Is(err, bsmlock.ErrNotObtained) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	w.lk = lk
	return true, nil
}

func (w *bsmWorker) block(ctx context.Context) error {
	lk, err := w.c.Obtain(ctx, w.key, cycleTTL, w.blocking)
	if err != nil {
		return err
	}
	w.lk = lk
	return nil
}

func (w *bsmWorker) unlock(ctx context.Context) error {
	lk := w.lk
	w.lk = nil
	if lk == nil {
		return errors.New("bsm/redislock: unlock without a lock")
	}
	return lk.Release(ctx)
}

// --- github.com/go-redsync/redsync/v4, one goredis/v9 pool -------------------

func newRedsync(addr string) *library {
	rdb := redis.NewClient(clientOptions(addr))
	rs := redsync.New(goredis.NewPool(rdb))
	return &library{name: "redsync", close: func() { _ = rdb.Close() }, newWorker: func(key string) worker {
		// One Mutex per goroutine (a Mutex remembers the value it locked
		// with). Expiry = our TTL; Tries raised so that a blocking Lock
		// keeps trying for the whole cell; the default delay function
		// (random 50..250ms) is kept. TryLock makes a single attempt
		// whatever Tries is.
		return &rsWorker{m: rs.NewMutex(key, redsync.WithExpiry(cycleTTL), redsync.WithTries(math.MaxInt32))}
	}}
}

type rsWorker struct {
	m *redsync.Mutex
}

func (w *rsWorker) try(ctx context.Context) (bool, error) {
	err := w.m.TryLockContext(ctx)
	var taken *redsync.ErrTaken
	if errors.As(err, &taken) || errors.Is(err, redsync.ErrFailed) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	return true, nil
}

func (w *rsWorker) block(ctx context.Context) error {
	return w.m.LockContext(ctx)
}

func (w *rsWorker) unlock(ctx context.Context) error {
	ok, err := w.m.UnlockContext(ctx)
	if err != nil {
		return err
	}
	if !ok {
		return fmt.Errorf("redsync: unlock %s: not held", w.m.Name())
	}
	return nil
}
