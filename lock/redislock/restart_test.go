package redislock_test

import (
	"testing"

	"github.com/onceguard/onceguard/internal/redistest"
	"github.com/onceguard/onceguard/lock"
	"github.com/onceguard/onceguard/lock/redislock"
)

// A release or refresh right after Redis restarted (its data lost)
// answers what Redis now knows: the lock is not held (ErrExpired), never
// a broken connection's EOF (go-redis checks a pooled connection before
// it sends on it, even with retries off, as here). rueidislock has the
// same test.
func TestOwnerCallsAfterRestart(t *testing.T) {
	srv, c := ownRedis(t)
	redistest.OwnerCallsAfterRestart(t, srv, lock.New(redislock.New(c, nil), nil))
}
