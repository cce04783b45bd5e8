package redistest

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/onceguard/onceguard/internal/faultproxy"
	"github.com/onceguard/onceguard/lock"
)

// StartBehindProxy starts a Redis server of the test's own and a
// faultproxy in front of it; clients connect to the proxy's Addr.
func StartBehindProxy(t *testing.T) *faultproxy.Proxy {
	t.Helper()
	srv := StartServer(t)
	p, err := faultproxy.Start(srv.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return p
}

// CancelledMidCall checks, for a Locker whose backend reaches Redis
// through p, that a caller whose context ends while its acquire is on the
// wire (sent, and taken by Redis, before its reply is back) does not
// leave the lock held until its TTL (PITFALLS 7): the backend waits for
// the reply on a context of its own, so the caller gets the lease (and
// releases it) or learns the lock was not had. A backend that gave up
// with the caller would leave a lock nobody knows to release.
func CancelledMidCall(t *testing.T, p *faultproxy.Proxy, l *lock.Locker) {
	t.Helper()
	const latency = 150 * time.Millisecond // each way: Redis takes the command at 150ms, the reply is back at 300ms
	for i := range 3 {
		key := fmt.Sprintf("cancelled-%d", i)
		p.SetLatency(latency)
		ctx, cancel := context.WithTimeout(context.Background(), latency+latency/3)
		lease, err := l.TryAcquire(ctx, key, time.Minute)
		cancel()
		p.SetLatency(0)
		if lease != nil {
			if err := lease.Release(context.Background()); err != nil {
				t.Errorf("round %d: Release of the lease the cancelled caller got = %v", i, err)
			}
		}
		again, err2 := l.TryAcquire(context.Background(), key, time.Minute)
		if err2 != nil {
			t.Fatalf("round %d: the cancelled caller got (%v, %v); then TryAcquire = %v: the lock was left held", i, lease != nil, err, err2)
		}
		_ = again.Release(context.Background())
	}
}
