package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"

	"github.com/redis/go-redis/v9"
	"github.com/redis/rueidis"
)

// The hand-written minimal Redis lock, the baseline of onceguard's Redis
// backends: SET key token NX PX to acquire, a compare-and-delete script
// (EVALSHA, EVAL on NOSCRIPT) to release. No fencing token, no lease
// (nothing tells the holder it lost the lock), no renewal, no waiter queue:
// the least a correct try-lock sends, one command per call. It is written
// as cheaply as it can be: the token is a per-worker random prefix and a
// counter (unique, no crypto/rand per cycle), the script's SHA-1 is
// computed once. Try scenarios only (it has no blocking acquire).
const (
	libMinGoRedis = "minimal-goredis"
	libMinRueidis = "minimal-rueidis"
	// libMinFenced is minimal-rueidis with a fencing token: INCR of a
	// counter key sent with the SET in one DoMulti (one round trip), as
	// onceguard's try does. Not a baseline: it shows what the fence alone
	// costs, the part of onceguard's cycle no design can skip.
	libMinFenced = "minimal-rueidis+fence"
	// libMinGoRedisFenced is the same on go-redis: SET and INCR in one
	// pipeline (the worker's own, reused), then the script.
	libMinGoRedisFenced = "minimal-goredis+fence"
)

// minimalRelease deletes KEYS[1] if it holds ARGV[1].
const minimalRelease = `if redis.call("get", KEYS[1]) == ARGV[1] then return redis.call("del", KEYS[1]) else return 0 end`

// minimalLibs are the names of the minimal designs, for the report.
var minimalLibs = []string{libMinGoRedis, libMinRueidis}

// tokenPrefix returns a fresh random prefix for one worker's tokens.
func tokenPrefix() []byte {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.AppendEncode(make([]byte, 0, 40), b[:])
}

type minToken struct {
	prefix []byte // random, per worker
	n      uint64
	buf    []byte
}

func (t *minToken) next() string {
	t.n++
	t.buf = strconv.AppendUint(append(t.buf[:0], t.prefix...), t.n, 36)
	return string(t.buf)
}

// --- on go-redis --------------------------------------------------------------

func newMinimalGoRedis(addr string, fenced bool) *library {
	name := libMinGoRedis
	if fenced {
		name = libMinGoRedisFenced
	}
	rdb := redis.NewClient(clientOptions(addr))
	release := redis.NewScript(minimalRelease)
	return &library{name: name, tryOnly: true, close: func() { _ = rdb.Close() }, newWorker: func(key string) worker {
		w := &minGoRedisWorker{rdb: rdb, release: release, key: key, keys: []string{key}, tok: minToken{prefix: tokenPrefix()}}
		if fenced {
			w.fenceKey, w.pipe = key+":fence", rdb.Pipeline()
		}
		return w
	}}
}

type minGoRedisWorker struct {
	rdb      *redis.Client
	release  *redis.Script
	key      string
	fenceKey string          // fenced: INCR it with the SET
	pipe     redis.Pipeliner // fenced
	keys     []string
	tok      minToken
	held     string
	fence    int64
}

func (w *minGoRedisWorker) try(ctx context.Context) (bool, error) {
	v := w.tok.next()
	var err error
	if w.pipe == nil {
		err = w.rdb.Do(ctx, "set", w.key, v, "nx", "px", cycleTTL.Milliseconds()).Err()
	} else {
		set := w.pipe.Do(ctx, "set", w.key, v, "nx", "px", cycleTTL.Milliseconds())
		incr := w.pipe.Incr(ctx, w.fenceKey)
		_, _ = w.pipe.Exec(ctx)
		if err = set.Err(); err == nil {
			w.fence, err = incr.Result()
		}
	}
	if errors.Is(err, redis.Nil) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	w.held = v
	return true, nil
}

func (w *minGoRedisWorker) block(context.Context) error {
	return errors.New(libMinGoRedis + ": no blocking acquire")
}

func (w *minGoRedisWorker) unlock(ctx context.Context) error {
	n, err := w.release.Run(ctx, w.rdb, w.keys, w.held).Int64()
	if err != nil {
		return err
	}
	if n != 1 {
		return fmt.Errorf("%s: release %s: not held", libMinGoRedis, w.key)
	}
	return nil
}

// --- on rueidis ---------------------------------------------------------------

func newMinimalRueidis(addr string, fenced bool) *library {
	name := libMinRueidis
	if fenced {
		name = libMinFenced
	}
	c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{addr}})
	if err != nil {
		return &library{name: name, tryOnly: true, close: func() {}, newWorker: func(string) worker { return errWorker{err} }}
	}
	release := rueidis.NewLuaScript(minimalRelease)
	return &library{name: name, tryOnly: true, close: c.Close, newWorker: func(key string) worker {
		w := &minRueidisWorker{c: c, release: release, key: key, keys: []string{key}, tok: minToken{prefix: tokenPrefix()}}
		if fenced {
			w.fenceKey = key + ":fence"
		}
		return w
	}}
}

type minRueidisWorker struct {
	c        rueidis.Client
	release  *rueidis.Lua
	key      string
	fenceKey string // fenced: INCR it with the SET
	keys     []string
	tok      minToken
	held     string
	fence    int64
}

func (w *minRueidisWorker) try(ctx context.Context) (bool, error) {
	v := w.tok.next()
	set := w.c.B().Set().Key(w.key).Value(v).Nx().PxMilliseconds(cycleTTL.Milliseconds()).Build()
	var err error
	if w.fenceKey == "" {
		err = w.c.Do(ctx, set).Error()
	} else {
		res := w.c.DoMulti(ctx, set, w.c.B().Incr().Key(w.fenceKey).Build())
		if err = res[0].Error(); err == nil {
			w.fence, err = res[1].AsInt64()
		}
	}
	if rueidis.IsRedisNil(err) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	w.held = v
	return true, nil
}

func (w *minRueidisWorker) block(context.Context) error {
	return errors.New(libMinRueidis + ": no blocking acquire")
}

func (w *minRueidisWorker) unlock(ctx context.Context) error {
	n, err := w.release.Exec(ctx, w.c, w.keys, []string{w.held}).AsInt64()
	if err != nil {
		return err
	}
	if n != 1 {
		return fmt.Errorf("%s: release %s: not held", libMinRueidis, w.key)
	}
	return nil
}
