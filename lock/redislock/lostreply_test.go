package redislock_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/onceguard/onceguard/internal/redistest"
	"github.com/onceguard/onceguard/lock"
	"github.com/onceguard/onceguard/lock/redislock"
)

// loseReply is a dialer whose connections lose the reply to the next
// write containing marker (armed with arm): the server gets and runs the
// commands, then the connection breaks before the client reads their
// replies, as when a connection is reset after the server answered.
type loseReply struct {
	marker []byte
	armed  atomic.Bool
	slow   time.Duration // not lost: late by this much
}

func (d *loseReply) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	var nd net.Dialer
	c, err := nd.DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	return &lossyConn{Conn: c, d: d}, nil
}

type lossyConn struct {
	net.Conn
	d    *loseReply
	mu   sync.Mutex
	lose bool
}

func (c *lossyConn) Write(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	if bytes.Contains(p, c.d.marker) && c.d.armed.CompareAndSwap(true, false) {
		c.mu.Lock()
		c.lose = true
		c.mu.Unlock()
	}
	return n, err
}

func (c *lossyConn) Read(p []byte) (int, error) {
	c.mu.Lock()
	lose := c.lose
	c.mu.Unlock()
	if lose && c.d.slow > 0 {
		c.mu.Lock()
		c.lose = false
		c.mu.Unlock()
		time.Sleep(c.d.slow)
		return c.Conn.Read(p)
	}
	if lose {
		// The server answered (it ran the commands); the answer is lost.
		_, _ = c.Conn.Read(make([]byte, 4096))
		time.Sleep(20 * time.Millisecond)
		_ = c.Conn.Close()
		return 0, io.ErrUnexpectedEOF
	}
	return c.Conn.Read(p)
}

func lossyClient(t *testing.T, marker string) (*redis.Client, *loseReply) {
	t.Helper()
	redistest.Shared(t) // skips without ONCEGUARD_TEST_REDIS
	opt, err := redis.ParseURL(os.Getenv("ONCEGUARD_TEST_REDIS"))
	if err != nil {
		t.Fatal(err)
	}
	d := &loseReply{marker: []byte(marker)}
	opt.Dialer = d.dial // the client's defaults otherwise: MaxRetries 3
	rdb := redis.NewClient(opt)
	t.Cleanup(func() { _ = rdb.Close() })
	return rdb, d
}

// A try whose reply is lost after Redis ran its SET NX: go-redis retries
// the pipeline on a new connection (its default MaxRetries), the SET NX
// finds the lock the first attempt took for this very owner, and the try
// is reported not acquired, while Redis holds the lock for that owner
// until its TTL: nobody gets it meanwhile, and nobody will release it.
func TestTryLostReplyLeaksLock(t *testing.T) {
	ctx := context.Background()
	shared := redistest.Shared(t)
	prefix := redistest.Prefix(t, shared, "og-lostreply")
	rdb, d := lossyClient(t, prefix)
	b := redislock.New(rdb, &redislock.Options{Prefix: prefix})
	key := "try"

	d.armed.Store(true)
	_, err := b.Acquire(ctx, lock.Request{Key: key, Owner: "owner-a", TTL: 30 * time.Second})
	held, _ := shared.Get(ctx, prefix+"{"+key+"}").Result()
	if errors.Is(err, lock.ErrNotAcquired) && held == "owner-a" {
		t.Fatalf("try reported %v, but Redis holds the lock for its owner (%q, PTTL %v): leaked until its TTL",
			err, held, shared.PTTL(ctx, prefix+"{"+key+"}").Val())
	}
	if err == nil {
		if held != "owner-a" {
			t.Fatalf("acquired, but the lock holds %q", held)
		}
		return
	}
	if held != "" {
		t.Fatalf("try failed (%v) and left the lock held by %q", err, held)
	}
}

// The same for a blocked Acquire, whose acquire script the docs call safe
// to retry: the retried script finds the lock held by its own owner and
// queues the caller behind itself, so Acquire waits out its own lock's
// TTL.
func TestBlockedAcquireLostReplyWaitsForItself(t *testing.T) {
	ctx := context.Background()
	shared := redistest.Shared(t)
	prefix := redistest.Prefix(t, shared, "og-lostreply")
	rdb, d := lossyClient(t, prefix)
	l := lock.New(redislock.New(rdb, &redislock.Options{Prefix: prefix}), nil)

	d.armed.Store(true)
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	start := time.Now()
	lease, err := l.Acquire(ctx, "blocked", 10*time.Second)
	if err != nil {
		t.Fatalf("Acquire of a free lock whose first reply was lost: %v after %v (lock value %q, PTTL %v)",
			err, time.Since(start).Round(time.Millisecond),
			shared.Get(context.Background(), prefix+"{blocked}").Val(), shared.PTTL(context.Background(), prefix+"{blocked}").Val())
	}
	_ = lease.Release(context.Background())
}

// Options.Timeout: "a call that has been sent is always waited for, so
// that a lock taken on the way is never lost track of". A try whose reply
// comes after Timeout (Redis ran the SET; the reply is slow) answers
// ErrUnavailable, and the lock stays held for its owner until its TTL:
// behind package fallback the same owner then takes the database lock too,
// and its release there never reaches Redis.
func TestTimeoutLosesTakenLock(t *testing.T) {
	ctx := context.Background()
	shared := redistest.Shared(t)
	prefix := redistest.Prefix(t, shared, "og-timeout")
	opt, err := redis.ParseURL(os.Getenv("ONCEGUARD_TEST_REDIS"))
	if err != nil {
		t.Fatal(err)
	}
	opt.MaxRetries = -1
	opt.ContextTimeoutEnabled = true // else Options.Timeout does not bound socket reads
	d := &loseReply{marker: []byte(prefix), slow: 300 * time.Millisecond}
	opt.Dialer = d.dial
	rdb := redis.NewClient(opt)
	t.Cleanup(func() { _ = rdb.Close() })
	b := redislock.New(rdb, &redislock.Options{Prefix: prefix, Timeout: 100 * time.Millisecond})
	d.armed.Store(true)
	_, err = b.Acquire(ctx, lock.Request{Key: "k", Owner: "owner-a", TTL: 30 * time.Second})
	time.Sleep(300 * time.Millisecond) // whatever the backend does about it
	if held := shared.Get(ctx, prefix+"{k}").Val(); err != nil && held == "owner-a" {
		t.Fatalf("acquire answered %v, but Redis holds the lock for its owner (PTTL %v): lost track of",
			err, shared.PTTL(ctx, prefix+"{k}").Val())
	}
}
