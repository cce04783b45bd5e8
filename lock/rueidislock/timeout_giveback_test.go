package rueidislock_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"net"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/onceguard/onceguard/internal/redistest"
	"github.com/onceguard/onceguard/lock"
	"github.com/onceguard/onceguard/lock/rueidislock"
)

// Options.Timeout: "a call that has been sent is always waited for, so
// that a lock taken on the way is never lost track of". A try whose reply
// comes after Timeout (Redis ran the SET; the round trip is slow) answers
// ErrUnavailable and leaves the lock held for its owner until its TTL.
func TestTimeoutLosesTakenLock(t *testing.T) {
	ctx := context.Background()
	admin := redistest.Shared(t)
	prefix := redistest.Prefix(t, admin, "og-rueidis-timeout")
	opt, err := rueidis.ParseURL(os.Getenv("ONCEGUARD_TEST_REDIS"))
	if err != nil {
		t.Fatal(err)
	}
	opt.DisableCache = true
	var slow atomic.Bool // replies arrive 300ms late: Redis ran the commands at once
	opt.DialCtxFn = func(ctx context.Context, addr string, d *net.Dialer, _ *tls.Config) (net.Conn, error) {
		c, err := d.DialContext(ctx, "tcp", addr)
		if err != nil {
			return nil, err
		}
		return &slowReads{Conn: c, slow: &slow, marker: []byte(prefix)}, nil
	}
	c := newClient(t, opt)
	b := rueidislock.New(c, &rueidislock.Options{Prefix: prefix, Timeout: 100 * time.Millisecond})
	slow.Store(true)
	_, err = b.Acquire(ctx, lock.Request{Key: "k", Owner: "owner-a", TTL: 30 * time.Second})
	time.Sleep(300 * time.Millisecond)
	held := admin.Get(ctx, prefix+"{k}").Val()
	t.Logf("err %v held %q", err, held)
	if err != nil && held == "owner-a" {
		t.Fatalf("acquire answered %v, but Redis holds the lock for its owner (PTTL %v): lost track of",
			err, admin.PTTL(ctx, prefix+"{k}").Val())
	}
}

type slowReads struct {
	net.Conn
	slow   *atomic.Bool
	marker []byte
	late   atomic.Bool
}

func (c *slowReads) Write(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	if bytes.Contains(p, c.marker) && c.slow.CompareAndSwap(true, false) {
		c.late.Store(true)
	}
	return n, err
}

func (c *slowReads) Read(p []byte) (int, error) {
	if c.late.CompareAndSwap(true, false) {
		time.Sleep(300 * time.Millisecond) // the reply to what was just sent comes late
	}
	return c.Conn.Read(p)
}
