package lock

import (
	"context"
	"errors"
	"testing"
	"time"
)

type ctxKey struct{}

// detach is d.detach's context, as Release uses it.
func detach(d *deadlines, ctx context.Context, now time.Time) context.Context {
	c := d.detach(ctx, now)
	return &c
}

// Release's context keeps the caller's values, ignores its cancellation,
// and has a deadline timeout to timeout+slack after it was asked for; one
// asked for within the slack shares the deadline, a later one does not.
func TestDetachDeadline(t *testing.T) {
	d := newDeadlines(64 * time.Second)
	if d.slack != time.Second {
		t.Fatalf("slack = %v, want 1s (1/64)", d.slack)
	}
	parent, cancel := context.WithCancel(context.WithValue(context.Background(), ctxKey{}, "v"))
	cancel()
	now := time.Now()
	ctx := detach(d, parent, now)
	if ctx.Err() != nil {
		t.Fatalf("detached context done with its cancelled parent: %v", ctx.Err())
	}
	if got := ctx.Value(ctxKey{}); got != "v" {
		t.Fatalf("Value = %v, want the caller's v", got)
	}
	dl, ok := ctx.Deadline()
	if !ok || dl.Before(now.Add(64*time.Second)) || dl.After(now.Add(65*time.Second)) {
		t.Fatalf("Deadline = %v, %v; want within [now+64s, now+65s]", dl.Sub(now), ok)
	}
	same := detach(d, context.Background(), now.Add(999*time.Millisecond))
	if same.Done() != ctx.Done() {
		t.Fatal("a context asked for within the slack has a deadline of its own")
	}
	later := detach(d, context.Background(), now.Add(1001*time.Millisecond))
	if later.Done() == ctx.Done() {
		t.Fatal("a context asked for after the slack shares a deadline that is too early for it")
	}
	if dl2, _ := later.Deadline(); dl2.Sub(now) < 65001*time.Millisecond {
		t.Fatalf("later Deadline = now+%v, want ≥ now+65.001s", dl2.Sub(now))
	}
	// Each one holds its own caller's values.
	if later.Value(ctxKey{}) != nil {
		t.Fatal("a detached context shows another caller's value")
	}
}

// The context ends when the timeout has passed, never before, with
// DeadlineExceeded, and a context derived from it ends with it.
func TestDetachExpires(t *testing.T) {
	d := newDeadlines(20 * time.Millisecond)
	start := time.Now()
	ctx := detach(d, context.Background(), start)
	child, cancel := context.WithCancel(ctx)
	defer cancel()
	select {
	case <-child.Done():
	case <-time.After(time.Minute):
		t.Fatal("the derived context did not end within a minute of a 20ms timeout")
	}
	if took := time.Since(start); took < 20*time.Millisecond {
		t.Fatalf("ended after %v, before the 20ms timeout", took)
	}
	if !errors.Is(ctx.Err(), context.DeadlineExceeded) || !errors.Is(context.Cause(child), context.DeadlineExceeded) {
		t.Fatalf("Err = %v, child's cause %v; want DeadlineExceeded", ctx.Err(), context.Cause(child))
	}
}

// The caller's cancellation stays hidden from the context package's own
// lookups too: contexts derived from the detached one and AfterFunc
// follow the deadline, and once it passes Cause reports DeadlineExceeded,
// not the cause the caller cancelled with.
func TestDetachHidesCallerCancel(t *testing.T) {
	d := newDeadlines(20 * time.Millisecond)
	parent, cancel := context.WithCancelCause(context.WithValue(context.Background(), ctxKey{}, "v"))
	cancel(errors.New("caller gave up"))
	start := time.Now()
	ctx := detach(d, parent, start)
	child, stop := context.WithCancel(ctx)
	defer stop()
	fired := make(chan struct{})
	defer context.AfterFunc(ctx, func() { close(fired) })()
	if got := context.WithoutCancel(child).Value(ctxKey{}); got != "v" {
		t.Fatalf("Value through derived contexts = %v, want the caller's v", got)
	}
	for _, done := range []<-chan struct{}{child.Done(), fired} {
		select {
		case <-done:
		case <-time.After(time.Minute):
			t.Fatal("not done within a minute of a 20ms timeout")
		}
	}
	if took := time.Since(start); took < 20*time.Millisecond {
		t.Fatalf("ended after %v, before the 20ms timeout: with the caller's cancellation", took)
	}
	for _, c := range []context.Context{ctx, child} {
		if cause := context.Cause(c); !errors.Is(cause, context.DeadlineExceeded) {
			t.Fatalf("Cause = %v, want DeadlineExceeded (not the caller's cause)", cause)
		}
	}
}
