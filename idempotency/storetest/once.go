package storetest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/onceguard/onceguard/idempotency"
	"github.com/onceguard/onceguard/idempotency/idemstore"
)

// once checks idempotency.Once on the store: an event's fn runs once
// however often and however concurrently it is delivered; a failed,
// panicked or crashed delivery leaves the event to the next one.
func once(t *testing.T, newStore func(t *testing.T) idemstore.FullStore) {
	ctx := context.Background()
	source := func(t *testing.T) string { return fmt.Sprint(t.Name(), "/", time.Now().UnixNano()) }

	t.Run("Redelivery", func(t *testing.T) {
		s, src := newStore(t), source(t)
		var effects atomic.Int32
		fn := func(context.Context) error { effects.Add(1); return nil }
		for i, want := range []bool{true, false, false} {
			ran, err := idempotency.Once(ctx, s, src, "evt_1", nil, fn)
			if err != nil || ran != want {
				t.Fatalf("delivery %d = %v, %v; want ran %v, nil", i+1, ran, err, want)
			}
		}
		// Another event, and the same id from another source, are new.
		for _, c := range []struct{ src, id string }{{src, "evt_2"}, {src + "-other", "evt_1"}} {
			if ran, err := idempotency.Once(ctx, s, c.src, c.id, nil, fn); err != nil || !ran {
				t.Errorf("Once(%s, %s) = %v, %v; want ran", c.src, c.id, ran, err)
			}
		}
		if n := effects.Load(); n != 3 {
			t.Errorf("effects = %d; want 3 (evt_1 once, evt_2, the other source's evt_1)", n)
		}
		for _, c := range []struct{ src, id string }{{"", "evt_1"}, {src, ""}} {
			if ran, err := idempotency.Once(ctx, s, c.src, c.id, nil, fn); !errors.Is(err, idempotency.ErrKeyMissing) || ran {
				t.Errorf("Once(%q, %q) = %v, %v; want ErrKeyMissing", c.src, c.id, ran, err)
			}
		}
		if n := effects.Load(); n != 3 {
			t.Errorf("effects after the refused calls = %d; want still 3", n)
		}
	})

	t.Run("FailureFrees", func(t *testing.T) {
		s, src := newStore(t), source(t)
		boom := errors.New("boom")
		if ran, err := idempotency.Once(ctx, s, src, "evt_1", nil, func(context.Context) error { return boom }); !errors.Is(err, boom) || ran {
			t.Fatalf("Once with fn failing = %v, %v; want fn's error, not ran", ran, err)
		}
		func() {
			defer func() {
				if recover() == nil {
					t.Fatal("fn's panic did not reach the caller")
				}
			}()
			_, _ = idempotency.Once(ctx, s, src, "evt_1", nil, func(context.Context) error { panic("fn") })
		}()
		var effects int
		for i, want := range []bool{true, false} {
			ran, err := idempotency.Once(ctx, s, src, "evt_1", nil, func(context.Context) error { effects++; return nil })
			if err != nil || ran != want {
				t.Fatalf("delivery %d after the failures = %v, %v; want ran %v", i+1, ran, err, want)
			}
		}
		if effects != 1 {
			t.Errorf("effects = %d; want 1", effects)
		}
	})

	t.Run("CrashedDelivery", func(t *testing.T) {
		// A delivery began the event and its process died: the record is
		// in flight with nobody to finish it. Until its lease runs out a
		// redelivery is told to retry later; after it, the event is taken
		// over and fn runs.
		s, src, now := newStore(t), source(t), time.Now()
		id := idempotency.RecordID(idempotency.OnceScope(src), "evt_1")
		if res, err := s.Begin(ctx, idemstore.BeginRequest{ID: id, Lease: time.Minute, TTL: time.Hour, Now: now}); err != nil || res.Outcome != idemstore.Started {
			t.Fatalf("the crashed delivery's Begin = %+v, %v", res, err)
		}
		var effects int
		fn := func(context.Context) error { effects++; return nil }
		at := func(d time.Duration) *idempotency.DoOptions {
			return &idempotency.DoOptions{Lease: time.Minute, Now: func() time.Time { return now.Add(d) }}
		}
		if ran, err := idempotency.Once(ctx, s, src, "evt_1", at(30*time.Second), fn); !errors.Is(err, idempotency.ErrInProgress) || ran || effects != 0 {
			t.Fatalf("redelivery inside the lease = %v, %v (%d effects); want ErrInProgress, none", ran, err, effects)
		}
		if ran, err := idempotency.Once(ctx, s, src, "evt_1", at(2*time.Minute), fn); err != nil || !ran || effects != 1 {
			t.Fatalf("redelivery after the lease = %v, %v (%d effects); want ran once", ran, err, effects)
		}
		if ran, err := idempotency.Once(ctx, s, src, "evt_1", at(3*time.Minute), fn); err != nil || ran || effects != 1 {
			t.Fatalf("redelivery after it = %v, %v (%d effects); want a duplicate", ran, err, effects)
		}
	})

	t.Run("ConcurrentDuplicates", func(t *testing.T) {
		// 20 deliveries at once: the one that runs fn holds it until the
		// other 19 have had their answer, which must be ErrInProgress
		// (never "done": fn may still fail). Delivered again after, each
		// is a duplicate.
		s, src := newStore(t), source(t)
		const n = 20
		var (
			effects, running atomic.Int32
			answered         sync.WaitGroup
			results          = make([]error, n)
			rans             = make([]bool, n)
			start            = make(chan struct{})
			wg               sync.WaitGroup
		)
		answered.Add(n - 1)
		othersDone := make(chan struct{})
		go func() { answered.Wait(); close(othersDone) }()
		fn := func(ctx context.Context) error {
			if running.Add(1) > 1 {
				return errors.New("fn runs twice at once")
			}
			defer running.Add(-1)
			select {
			case <-othersDone:
			case <-time.After(20 * time.Second):
				return errors.New("the other deliveries did not answer while fn ran")
			}
			effects.Add(1)
			return nil
		}
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				rans[i], results[i] = idempotency.Once(ctx, s, src, "evt_1", nil, fn)
				if !rans[i] {
					answered.Done()
				}
			}()
		}
		close(start)
		wg.Wait()
		ran, busy := 0, 0
		for i := range n {
			switch {
			case rans[i] && results[i] == nil:
				ran++
			case !rans[i] && errors.Is(results[i], idempotency.ErrInProgress):
				busy++
			default:
				t.Errorf("delivery %d = %v, %v; want ran, or ErrInProgress", i, rans[i], results[i])
			}
		}
		if ran != 1 || busy != n-1 || effects.Load() != 1 {
			t.Fatalf("%d ran, %d in progress, %d effects; want 1, %d, 1", ran, busy, effects.Load(), n-1)
		}
		for i := range n {
			if r, err := idempotency.Once(ctx, s, src, "evt_1", nil, fn); err != nil || r {
				t.Errorf("redelivery %d after the run = %v, %v; want a duplicate", i, r, err)
			}
		}
		if effects.Load() != 1 {
			t.Errorf("effects = %d; want 1", effects.Load())
		}
	})
}
