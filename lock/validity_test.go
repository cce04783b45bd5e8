package lock_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/onceguard/onceguard/lock"
	"github.com/onceguard/onceguard/lock/memlock"
)

// slowReplies is a backend whose answers to Acquire and Refresh come back
// delay after the server acted on them (a slow network, a paused client).
type slowReplies struct {
	memlock.Backend
	delay time.Duration
}

func (b *slowReplies) Acquire(ctx context.Context, r lock.Request) (lock.Grant, error) {
	g, err := b.Backend.Acquire(ctx, r)
	time.Sleep(b.delay)
	return g, err
}

func (b *slowReplies) Refresh(ctx context.Context, key, owner string, ttl time.Duration) error {
	err := b.Backend.Refresh(ctx, key, owner, ttl)
	time.Sleep(b.delay)
	return err
}

// PITFALLS 1 and 3: the server's TTL runs from when it took the command,
// which the client knows only to be after it sent it. So a lease's local
// validity counts from the send, never from the reply: a reply that took
// long leaves less validity, not more. Counted from the reply, Deadline
// would lie past the server's expiry by the reply's delay, and the
// holder would go on writing after another could have taken the lock.
func TestValidityFromSend(t *testing.T) {
	const ttl, delay = time.Second, 300 * time.Millisecond
	l := lock.New(&slowReplies{delay: delay}, nil)
	ctx := context.Background()
	for _, acquire := range []struct {
		name string
		f    func() (*lock.Lease, error)
	}{
		{"TryAcquire", func() (*lock.Lease, error) { return l.TryAcquire(ctx, "try", ttl) }},
		{"Acquire", func() (*lock.Lease, error) { return l.Acquire(ctx, "wait", ttl) }},
	} {
		sent := time.Now()
		lease, err := acquire.f()
		if err != nil {
			t.Fatalf("%s: %v", acquire.name, err)
		}
		if d := lease.Deadline(); d.After(sent.Add(ttl)) {
			t.Errorf("%s: Deadline %v after the send; want at most the TTL, %v", acquire.name, d.Sub(sent), ttl)
		}
		monotonic(t, acquire.name+": Deadline", lease.Deadline())
		sent = time.Now()
		if err := lease.Refresh(ctx, ttl); err != nil {
			t.Fatalf("%s: Refresh: %v", acquire.name, err)
		}
		if d := lease.Deadline(); d.After(sent.Add(ttl)) {
			t.Errorf("%s: Deadline %v after the refresh was sent; want at most the TTL, %v", acquire.name, d.Sub(sent), ttl)
		}
		monotonic(t, acquire.name+": Deadline after Refresh", lease.Deadline())
		_ = lease.Release(ctx)
	}
}

// monotonic fails the test unless d carries a monotonic clock reading
// (PITFALLS 3): a deadline on the wall clock alone would move with a
// clock jump. time.Time's String shows the reading as "m=±<seconds>".
func monotonic(t *testing.T, what string, d time.Time) {
	t.Helper()
	if !strings.Contains(d.String(), " m=") {
		t.Errorf("%s %v has no monotonic reading; want one (a wall-clock jump would move it)", what, d)
	}
}

// Constructors name what is missing instead of a nil dereference later.
func TestNilBackendPanics(t *testing.T) {
	defer func() {
		if v := recover(); v != "lock: New needs a Backend" {
			t.Errorf("New(nil) recovered %v; want the named panic", v)
		}
	}()
	lock.New(nil, nil)
}
