package rueidislock_test

import (
	"testing"

	"github.com/onceguard/onceguard/internal/redistest"
	"github.com/onceguard/onceguard/lock"
	"github.com/onceguard/onceguard/lock/rueidislock"
)

// A release or refresh right after Redis restarted (its data lost) meets
// a connection the restart broke. Both compare by owner, so they are sent
// again on a new connection, and answer what Redis now knows: the lock is
// not held (ErrExpired), never the broken connection's EOF.
func TestOwnerCallsAfterRestart(t *testing.T) {
	srv, c := ownRedis(t)
	redistest.OwnerCallsAfterRestart(t, srv, lock.New(rueidislock.New(c, nil), nil))
}
