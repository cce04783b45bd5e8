package fallback_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/onceguard/onceguard/lock"
	"github.com/onceguard/onceguard/lock/fallback"
	"github.com/onceguard/onceguard/lock/memlock"
)

// flaky stands in for a Redis backend that stops answering while down is
// set.
type flaky struct {
	lock.Backend
	down atomic.Bool
}

func (f *flaky) Acquire(ctx context.Context, r lock.Request) (lock.Grant, error) {
	if f.down.Load() {
		return lock.Grant{}, fmt.Errorf("primary: %w", lock.ErrUnavailable)
	}
	return f.Backend.Acquire(ctx, r)
}

// The breaker serves from the primary, moves to the secondary the moment
// the primary does not answer (the failing acquire itself is served there:
// the caller sees no error), and goes back once a probe finds the primary
// answering. In a service the primary is redislock and the secondary
// sqllock on the service's own database.
func Example() {
	ctx := context.Background()
	primary := &flaky{Backend: &memlock.Backend{}}
	b := fallback.New(primary, &memlock.Backend{}, &fallback.Options{Cooldown: time.Millisecond})
	locker := lock.New(b, nil)

	lease, err := locker.TryAcquire(ctx, "account:alice", time.Second)
	fmt.Println(err, b.State())
	_ = lease.Release(ctx)

	primary.down.Store(true) // Redis goes away
	lease, err = locker.TryAcquire(ctx, "account:alice", time.Second)
	fmt.Println(err, b.State(), b.Degraded())
	_ = lease.Release(ctx)

	primary.down.Store(false) // and comes back
	time.Sleep(2 * time.Millisecond)
	fmt.Println(b.Probe(ctx)) // as the service's /readyz does
	s := b.Stats()
	fmt.Println(s.Opened, s.Recovered)
	// Output:
	// <nil> closed
	// <nil> open true
	// closed
	// 1 1
}
