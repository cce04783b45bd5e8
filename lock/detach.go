package lock

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// deadlines hands out the contexts Release runs on: detached from the
// caller's cancellation, with the caller's values, and done when
// ReleaseTimeout has passed (and at most slack more). A context of its own
// per Release would cost a timer per lock cycle (arming and stopping it,
// under the runtime's timer lock, was about 8% of a cycle's CPU in
// rueidislock's BenchmarkCycleParallel) and five allocations; instead, all
// Releases that start within one slack share one deadline context, made
// by whichever of them finds the last one too early for it, and a
// Release keeps its context in its Lease.
type deadlines struct {
	timeout, slack time.Duration

	cur atomic.Pointer[deadline]
	mu  sync.Mutex // serialises making a new one
}

// deadline is one shared deadline context.
type deadline struct {
	ctx    context.Context // context.WithDeadline(Background, end)
	cancel context.CancelFunc
	end    time.Time // monotonic
}

func newDeadlines(timeout time.Duration) *deadlines {
	return &deadlines{timeout: timeout, slack: max(timeout/64, time.Microsecond)}
}

// detach returns ctx's values on a context that is not cancelled with ctx
// and whose deadline is timeout to timeout+slack after now. It is a value,
// for the caller to keep where it has room (a *detached is the context;
// the value itself is not one).
func (d *deadlines) detach(ctx context.Context, now time.Time) detached {
	return detached{Context: d.get(now).ctx, values: ctx}
}

func (d *deadlines) get(now time.Time) *deadline {
	want := now.Add(d.timeout)
	if dl := d.cur.Load(); dl != nil && !dl.end.Before(want) {
		return dl
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if dl := d.cur.Load(); dl != nil && !dl.end.Before(want) {
		return dl
	}
	dl := &deadline{end: want.Add(d.slack)}
	// Its timer cancels it at end, which frees it; cancel is kept only
	// because a context's resources are its CancelFunc's to free.
	dl.ctx, dl.cancel = context.WithDeadline(context.Background(), dl.end)
	d.cur.Store(dl)
	return dl
}

// detached is a shared deadline context (Deadline, Done, Err, and the
// context package's own lookups, which let a context derived from it
// register with it instead of watching it from a goroutine) carrying the
// values of a caller's context, values.
type detached struct {
	context.Context
	values context.Context
}

// Value returns the deadline context's value for key, else the caller's.
// The deadline context, made from Background, holds no value but the
// context package's own key, under which it returns itself: asked first,
// it answers that lookup (context.Cause, deriving a context) with the
// deadline context and never the caller's, so the caller's cancellation
// stays hidden without a context.WithoutCancel (an allocation) around it.
func (c *detached) Value(key any) any {
	if v := c.Context.Value(key); v != nil {
		return v
	}
	return c.values.Value(key)
}
