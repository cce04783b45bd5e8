package redislock_test

import (
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/onceguard/onceguard/internal/redistest"
	"github.com/onceguard/onceguard/lock"
	"github.com/onceguard/onceguard/lock/redislock"
)

// A caller whose context ends while its acquire is on the wire does not
// leave the lock held (the batcher sends and waits on a context of its
// own). The client honours context deadlines on its sockets
// (ContextTimeoutEnabled), as a caller's client may.
func TestCancelledMidCall(t *testing.T) {
	p := redistest.StartBehindProxy(t)
	rdb := redis.NewClient(&redis.Options{Addr: p.Addr(), MaxRetries: -1, DialTimeout: time.Second, ReadTimeout: 2 * time.Second, ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = rdb.Close() })
	redistest.CancelledMidCall(t, p, lock.New(redislock.New(rdb, nil), nil))
}
