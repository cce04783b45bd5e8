package idempotency_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/onceguard/onceguard/idempotency"
	"github.com/onceguard/onceguard/idempotency/idemstore"
	"github.com/onceguard/onceguard/idempotency/memstore"
)

var doScope = idempotency.Scope{Principal: "worker", Method: "invoice.send"}

// Concurrent deliveries of one message run fn once; the others learn it
// is in progress, or get its stored result.
func TestDoConcurrentDeliveries(t *testing.T) {
	store := &memstore.Store{}
	var runs atomic.Int32
	release := make(chan struct{})
	fn := func(ctx context.Context) ([]byte, error) {
		runs.Add(1)
		<-release
		return []byte("sent"), nil
	}
	var wg sync.WaitGroup
	results := make(chan error, 10)
	for range 10 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, _, err := idempotency.Do(context.Background(), store, doScope, "msg-1", "v1", nil, fn)
			if err == nil && string(res) != "sent" {
				err = errors.New("result " + string(res))
			}
			results <- err
		}()
	}
	time.Sleep(50 * time.Millisecond)
	close(release)
	wg.Wait()
	close(results)
	for err := range results {
		if err != nil && !errors.Is(err, idempotency.ErrInProgress) {
			t.Errorf("delivery = %v; want the result or ErrInProgress", err)
		}
	}
	if n := runs.Load(); n != 1 {
		t.Errorf("fn ran %d times; want 1", n)
	}
	if res, replayed, err := idempotency.Do(context.Background(), store, doScope, "msg-1", "v1", nil, fn); err != nil || !replayed || string(res) != "sent" {
		t.Errorf("a later delivery = %q, %v, %v; want the stored result, replayed", res, replayed, err)
	}
}

// A failed or panicking fn frees the key: the redelivery runs fn again.
func TestDoFailureFreesKey(t *testing.T) {
	store := &memstore.Store{}
	boom := errors.New("boom")
	if _, _, err := idempotency.Do(context.Background(), store, doScope, "msg-2", "v1", nil, func(context.Context) ([]byte, error) { return nil, boom }); !errors.Is(err, boom) {
		t.Fatalf("Do = %v; want fn's error", err)
	}
	func() {
		defer func() {
			if v := recover(); v != "fn failed" {
				t.Errorf("recovered %v; want fn's panic to go on", v)
			}
		}()
		_, _, _ = idempotency.Do(context.Background(), store, doScope, "msg-2", "v1", nil, func(context.Context) ([]byte, error) { panic("fn failed") })
	}()
	res, replayed, err := idempotency.Do(context.Background(), store, doScope, "msg-2", "v1", nil, func(context.Context) ([]byte, error) { return []byte("ok"), nil })
	if err != nil || replayed || string(res) != "ok" {
		t.Errorf("redelivery after a failure and a panic = %q, %v, %v; want fn run again", res, replayed, err)
	}
}

// A message without an id is refused: with one record for every such
// message, each after the first would get the first's result.
func TestDoEmptyKey(t *testing.T) {
	store := &memstore.Store{}
	_, _, err := idempotency.Do(context.Background(), store, doScope, "", "v1", nil, func(context.Context) ([]byte, error) {
		t.Error("fn ran under an empty key")
		return nil, nil
	})
	if !errors.Is(err, idempotency.ErrKeyMissing) {
		t.Errorf("Do with an empty key = %v; want ErrKeyMissing", err)
	}
}

// fn's context ends before its lease does (PITFALLS 17), so that fn stops
// before another delivery may take the key over and run it beside fn.
func TestDoContextEndsInsideLease(t *testing.T) {
	store := &memstore.Store{}
	const lease = 300 * time.Millisecond
	start := time.Now()
	_, _, err := idempotency.Do(context.Background(), store, doScope, "msg-3", "v1", &idempotency.DoOptions{Lease: lease}, func(ctx context.Context) ([]byte, error) {
		// The lease began before fn was called: a deadline later than now + lease is outside it.
		if dl, ok := ctx.Deadline(); !ok || dl.After(time.Now().Add(lease)) {
			t.Errorf("fn's context deadline = %v (set %v); want one inside the lease, at most %v from now", dl, ok, lease)
		}
		select {
		case <-ctx.Done():
			return nil, context.Cause(ctx)
		case <-time.After(10 * time.Second):
			return []byte("too late"), nil
		}
	})
	if took := time.Since(start); err == nil || took >= 5*time.Second {
		t.Fatalf("Do with fn outlasting its lease = %v after %v; want fn's context ended near the lease", err, took)
	}
	// Nothing was stored: the next delivery runs.
	res, replayed, err := idempotency.Do(context.Background(), store, doScope, "msg-3", "v1", nil, func(context.Context) ([]byte, error) { return []byte("ok"), nil })
	if err != nil || replayed || string(res) != "ok" {
		t.Errorf("redelivery = %q, %v, %v; want fn run again", res, replayed, err)
	}
}

// fn's context carries the run (FromContext): Forget makes its result
// transient (returned, not kept: the next delivery runs fn again), and a
// result fn stored itself (MarkCompleted) is not stored again.
func TestDoCall(t *testing.T) {
	store := &memstore.Store{}
	var runs int
	forget := func(ctx context.Context) ([]byte, error) {
		runs++
		call, ok := idempotency.FromContext(ctx)
		if !ok || call.ID != idempotency.RecordID(doScope, "msg-4") || call.Lease == "" {
			t.Errorf("FromContext = %+v, %v; want the run's record and lease", call, ok)
			return nil, nil
		}
		call.Forget()
		return []byte("later"), nil
	}
	for range 2 {
		if res, replayed, err := idempotency.Do(context.Background(), store, doScope, "msg-4", "v1", nil, forget); err != nil || replayed || string(res) != "later" {
			t.Errorf("Do with Forget = %q, %v, %v; want the result, not replayed", res, replayed, err)
		}
	}
	if runs != 2 {
		t.Errorf("fn ran %d times; want 2 (a forgotten result is not kept)", runs)
	}
	self := func(ctx context.Context) ([]byte, error) {
		call, _ := idempotency.FromContext(ctx)
		if err := store.Complete(ctx, call.ID, call.Lease, idemstore.Response{Status: 200, Body: []byte("mine")}, time.Now()); err != nil {
			return nil, err
		}
		call.MarkCompleted()
		return []byte("returned"), nil
	}
	if _, _, err := idempotency.Do(context.Background(), store, doScope, "msg-5", "v1", nil, self); err != nil {
		t.Fatalf("Do completing itself = %v", err)
	}
	if res, replayed, err := idempotency.Do(context.Background(), store, doScope, "msg-5", "v1", nil, self); err != nil || !replayed || string(res) != "mine" {
		t.Errorf("redelivery = %q, %v, %v; want fn's own stored result, replayed", res, replayed, err)
	}
}
