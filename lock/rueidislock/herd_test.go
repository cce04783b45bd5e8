package rueidislock_test

import (
	"testing"

	"github.com/onceguard/onceguard/internal/redistest"
	"github.com/onceguard/onceguard/lock/rueidislock"
)

// PITFALLS 12 (thundering herd): a release wakes the first waiter only.
// redislock has the same test.
func TestReleaseWakesOneWaiter(t *testing.T) {
	_, c := ownRedis(t)
	redistest.ReleaseWakesOneWaiter(t, rueidislock.New(c, nil))
}
