package lock_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/onceguard/onceguard/lock"
)

// attempts refuses the first refuse attempts (ErrNotAcquired) and grants
// the next, recording each attempt's Request.Wait. As a lock.Waiter (with
// notify set) it records subscriptions and leaves in the same log.
type attempts struct {
	nopBackend
	refuse int
	notify bool // Wait subscribes; else it fails (no notifications: poll)

	mu  sync.Mutex
	log []string
}

func (b *attempts) Acquire(_ context.Context, r lock.Request) (lock.Grant, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	what := "try"
	if r.Wait {
		what = "wait"
	}
	b.log = append(b.log, what)
	if b.refuse > 0 {
		b.refuse--
		return lock.Grant{}, lock.ErrNotAcquired
	}
	return lock.Grant{Fence: 1}, nil
}

func (b *attempts) Wait(context.Context, string, string) (<-chan struct{}, func(), error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.log = append(b.log, "subscribe")
	if !b.notify {
		return nil, nil, errors.New("no notifications")
	}
	return make(chan struct{}), func() {}, nil
}

func (b *attempts) Leave(context.Context, string, string) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.log = append(b.log, "leave")
	return nil
}

func (b *attempts) seen() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return slices.Clone(b.log)
}

// A blocking Acquire's first attempt is a try, the backend's cheapest path
// on a free lock; only after finding the lock held does it subscribe and
// wait in line, and a waiter that gives up leaves the line it joined.
func TestAcquireTriesFirst(t *testing.T) {
	opts := &lock.Options{MinBackoff: time.Millisecond, MaxBackoff: 2 * time.Millisecond}
	for _, c := range []struct {
		name    string
		b       *attempts
		timeout time.Duration
		want    []string
	}{
		{"free", &attempts{notify: true}, time.Second, []string{"try"}},
		{"held, then released", &attempts{refuse: 2, notify: true}, time.Second, []string{"try", "subscribe", "wait", "wait"}},
		// Without notifications the waiter joins the line at once, then polls.
		{"held, no notifications", &attempts{refuse: 2}, time.Second, []string{"try", "subscribe", "wait", "subscribe", "wait"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), c.timeout)
			defer cancel()
			lease, err := lock.New(c.b, opts).Acquire(ctx, "k", time.Minute)
			if err != nil {
				t.Fatalf("Acquire: %v", err)
			}
			_ = lease.Release(context.Background())
			if got := c.b.seen(); !slices.Equal(got, c.want) {
				t.Fatalf("the backend saw %v, want %v", got, c.want)
			}
		})
	}

	// Held until the caller gives up: the try joined nothing, the waiting
	// attempts did, so the waiter leaves once at the end.
	b := &attempts{refuse: 1 << 30, notify: true}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if _, err := lock.New(b, opts).Acquire(ctx, "k", time.Minute); !errors.Is(err, lock.ErrNotAcquired) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Acquire = %v, want ErrNotAcquired and DeadlineExceeded", err)
	}
	got := b.seen()
	if len(got) < 4 || !slices.Equal(got[:3], []string{"try", "subscribe", "wait"}) || got[len(got)-1] != "leave" ||
		slices.Contains(got[3:len(got)-1], "try") || slices.Contains(got[:len(got)-1], "leave") {
		t.Fatalf("the backend saw %v, want try, subscribe, wait..., leave", got)
	}
}
