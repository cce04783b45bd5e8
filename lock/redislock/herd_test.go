package redislock_test

import (
	"testing"

	"github.com/onceguard/onceguard/internal/redistest"
	"github.com/onceguard/onceguard/lock/redislock"
)

// PITFALLS 12 (thundering herd): a release wakes the first waiter only.
// rueidislock has the same test.
func TestReleaseWakesOneWaiter(t *testing.T) {
	_, rdb := ownRedis(t)
	redistest.ReleaseWakesOneWaiter(t, redislock.New(rdb, nil))
}
