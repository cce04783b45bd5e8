package lock_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/onceguard/onceguard/lock"
)

// releaseRecorder fails every Release with ErrUnavailable and keeps the
// contexts they ran on.
type releaseRecorder struct {
	nopBackend
	mu   sync.Mutex
	ctxs []context.Context
}

func (b *releaseRecorder) Release(ctx context.Context, key, owner string) error {
	b.mu.Lock()
	b.ctxs = append(b.ctxs, ctx)
	b.mu.Unlock()
	return lock.ErrUnavailable
}

type releaseKey struct{}

// Each Release of a lease runs on a context of its own, with its own
// caller's values and a deadline from its own start, also when the lease
// keeps one of them (the first): a retry or a concurrent Release never
// changes another's context.
func TestReleaseContexts(t *testing.T) {
	b := &releaseRecorder{}
	l := lock.New(b, &lock.Options{ReleaseTimeout: time.Hour})
	lease, err := l.TryAcquire(context.Background(), "k", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for i := range 4 {
		wg.Go(func() {
			ctx, cancel := context.WithCancel(context.WithValue(context.Background(), releaseKey{}, i))
			cancel()
			_ = lease.Release(ctx)
		})
	}
	wg.Wait()
	start := time.Now()
	_ = lease.Release(context.WithValue(context.Background(), releaseKey{}, 4))

	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.ctxs) != 5 {
		t.Fatalf("%d releases reached the backend, want 5", len(b.ctxs))
	}
	seen := map[any]bool{}
	for i, ctx := range b.ctxs {
		if ctx.Err() != nil {
			t.Fatalf("release %d: context done (%v) with its cancelled caller's", i, ctx.Err())
		}
		v := ctx.Value(releaseKey{})
		if v == nil || seen[v] {
			t.Fatalf("release %d: value %v, want its own caller's (seen: %v)", i, v, seen)
		}
		seen[v] = true
	}
	last := b.ctxs[4]
	if last.Value(releaseKey{}) != 4 {
		t.Fatalf("the last release ran with value %v, want 4", last.Value(releaseKey{}))
	}
	if dl, ok := last.Deadline(); !ok || dl.Before(start.Add(time.Hour)) {
		t.Fatalf("the last release's deadline is %v after its start, want at least the 1h timeout", dl.Sub(start))
	}
}

// stuckRelease keeps, for each Release, whether its context was already
// done when it arrived; its first Release waits for that context to end
// and fails, as a release stuck on an unreachable backend does.
type stuckRelease struct {
	nopBackend
	mu      sync.Mutex
	arrived []error // ctx.Err() on arrival, per Release
}

func (b *stuckRelease) Release(ctx context.Context, key, owner string) error {
	b.mu.Lock()
	b.arrived = append(b.arrived, ctx.Err())
	first := len(b.arrived) == 1
	b.mu.Unlock()
	if first {
		<-ctx.Done()
		return lock.ErrUnavailable
	}
	return nil
}

// A Release's deadline runs from that Release, not from the acquire: a
// lease held longer than ReleaseTimeout still gets the whole timeout, and
// a retry after a Release that timed out gets one of its own.
func TestReleaseDeadlineFromEachRelease(t *testing.T) {
	const timeout = 30 * time.Millisecond
	b := &stuckRelease{}
	l := lock.New(b, &lock.Options{ReleaseTimeout: timeout})
	lease, err := l.TryAcquire(context.Background(), "k", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * timeout) // held past ReleaseTimeout
	start := time.Now()
	if err := lease.Release(context.Background()); !errors.Is(err, lock.ErrUnavailable) {
		t.Fatalf("the stuck Release = %v; want ErrUnavailable", err)
	}
	if waited := time.Since(start); waited < timeout*3/4 {
		t.Errorf("the stuck Release gave up after %v; want about ReleaseTimeout, %v, from its start", waited, timeout)
	}
	if err := lease.Release(context.Background()); err != nil {
		t.Fatalf("the retry = %v; want nil", err)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.arrived) != 2 || b.arrived[0] != nil || b.arrived[1] != nil {
		t.Fatalf("the Releases arrived with contexts done: %v; want two, neither done on arrival", b.arrived)
	}
}
