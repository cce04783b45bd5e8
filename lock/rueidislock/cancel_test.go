package rueidislock_test

import (
	"net"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/onceguard/onceguard/internal/redistest"
	"github.com/onceguard/onceguard/lock"
	"github.com/onceguard/onceguard/lock/rueidislock"
)

// A caller whose context ends while its acquire is on the wire does not
// leave the lock held: the call is sent and waited for on a context of
// its own (rueidis returns at once when a call's context ends).
func TestCancelledMidCall(t *testing.T) {
	p := redistest.StartBehindProxy(t)
	c := newClient(t, rueidis.ClientOption{InitAddress: []string{p.Addr()}, Dialer: net.Dialer{Timeout: time.Second}, ConnWriteTimeout: 2 * time.Second})
	redistest.CancelledMidCall(t, p, lock.New(rueidislock.New(c, nil), nil))
}
