package idempotency_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/onceguard/onceguard/idempotency"
	"github.com/onceguard/onceguard/idempotency/memstore"
)

// PITFALLS 17: the handler's context ends at nine tenths of the key's
// lease, with ErrLeaseEnding as its cause, whichever of its methods sees
// it first: Done, or Err, Value and context.Cause without a Done before
// (the deadline's timer is made on first need).
func TestHandlerContextEndsInsideLease(t *testing.T) {
	const lease = 300 * time.Millisecond
	for _, first := range []string{"Done", "Err", "Cause"} {
		t.Run(first, func(t *testing.T) {
			var (
				deadline time.Time
				err      error
				cause    error
				waited   time.Duration
			)
			h := idempotency.Middleware(idempotency.Config{Store: &memstore.Store{}, Lease: lease})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				ctx := r.Context()
				start := time.Now()
				var ok bool
				if deadline, ok = ctx.Deadline(); !ok {
					t.Error("no deadline")
				}
				switch first {
				case "Done":
					select {
					case <-ctx.Done():
					case <-time.After(10 * time.Second):
					}
				default: // past the deadline without waiting on the context
					time.Sleep(time.Until(deadline) + 10*time.Millisecond)
				}
				waited = time.Since(start)
				switch first {
				case "Cause":
					cause, err = context.Cause(ctx), ctx.Err()
				default:
					err, cause = ctx.Err(), context.Cause(ctx)
				}
				if _, ok := idempotency.FromContext(ctx); !ok {
					t.Error("the Call is lost from the context")
				}
				select {
				case <-ctx.Done():
				default:
					t.Error("Done is open after Err said the context ended")
				}
			}))
			start := time.Now()
			w := sendKey(h, "k")
			if limit := start.Add(lease); deadline.After(limit) || deadline.Before(start) {
				t.Errorf("deadline %v after the start; want within the lease (%v)", deadline.Sub(start), lease)
			}
			if waited >= 10*time.Second || !errors.Is(err, context.DeadlineExceeded) || !errors.Is(cause, idempotency.ErrLeaseEnding) {
				t.Errorf("after %v: Err = %v, Cause = %v; want DeadlineExceeded and ErrLeaseEnding", waited, err, cause)
			}
			if w.Code != 503 || !strings.Contains(w.Body.String(), "request_interrupted") {
				t.Errorf("the handler wrote nothing after its context ended: %d %s; want 503 request_interrupted", w.Code, w.Body)
			}
		})
	}
}

// A request whose own deadline comes before the lease's keeps it: the
// handler's context is the request's, and its cause the request's.
func TestHandlerContextRequestDeadlineFirst(t *testing.T) {
	var deadline time.Time
	var cause error
	h := idempotency.Middleware(idempotency.Config{Store: &memstore.Store{}, Lease: time.Minute})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		deadline, _ = r.Context().Deadline()
		<-r.Context().Done()
		cause = context.Cause(r.Context())
	}))
	errClient := errors.New("the request's own deadline")
	ctx, cancel := context.WithTimeoutCause(context.Background(), 50*time.Millisecond, errClient)
	defer cancel()
	want, _ := ctx.Deadline()
	r := httptest.NewRequestWithContext(ctx, http.MethodPost, "/x", strings.NewReader(`{}`))
	r.Header.Set("Idempotency-Key", "k")
	h.ServeHTTP(httptest.NewRecorder(), r)
	if !deadline.Equal(want) || cause != errClient {
		t.Errorf("deadline %v, cause %v; want the request's %v and its cause", deadline, cause, want)
	}
}

// Once the handler returned, its context's timer is stopped: what it left
// waiting on the context is woken (as net/http ends a request's context),
// not kept until the lease's deadline.
func TestHandlerContextEndsWithTheRequest(t *testing.T) {
	var done <-chan struct{}
	var ctx context.Context
	h := idempotency.Middleware(idempotency.Config{Store: &memstore.Store{}, Lease: time.Hour})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx, done = r.Context(), r.Context().Done()
		w.WriteHeader(201)
	}))
	if w := sendKey(h, "k"); w.Code != 201 {
		t.Fatalf("first = %d; want 201", w.Code)
	}
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("the handler's context is still open after its answer was sent")
	}
	if _, ok := idempotency.FromContext(ctx); !ok {
		t.Error("the Call is lost from the ended context")
	}
	select {
	case <-ctx.Done():
	default:
		t.Error("a Done taken after the answer is open")
	}
	if !errors.Is(ctx.Err(), context.Canceled) || !errors.Is(context.Cause(ctx), context.Canceled) {
		t.Errorf("after the answer: Err = %v, Cause = %v; want Canceled, as net/http's", ctx.Err(), context.Cause(ctx))
	}
}

// The same for a handler that never looked at its context while it ran.
func TestHandlerContextEndedUnseen(t *testing.T) {
	var ctx context.Context
	h := idempotency.Middleware(idempotency.Config{Store: &memstore.Store{}, Lease: time.Hour})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx = r.Context()
		w.WriteHeader(201)
	}))
	sendKey(h, "k")
	select {
	case <-ctx.Done():
	case <-time.After(5 * time.Second):
		t.Error("Done after the answer is open")
	}
	if !errors.Is(ctx.Err(), context.Canceled) || !errors.Is(context.Cause(ctx), context.Canceled) {
		t.Errorf("after the answer: Err = %v, Cause = %v; want Canceled", ctx.Err(), context.Cause(ctx))
	}
}

// What fn leaves behind sees its context end when Do returns.
func TestDoContextEndsWhenDoReturns(t *testing.T) {
	var ctx context.Context
	if _, _, err := idempotency.Do(context.Background(), &memstore.Store{}, idempotency.Scope{}, "k", "fp", &idempotency.DoOptions{Lease: time.Hour},
		func(c context.Context) ([]byte, error) { ctx = c; return []byte("x"), nil }); err != nil {
		t.Fatal(err)
	}
	select {
	case <-ctx.Done():
	case <-time.After(5 * time.Second):
		t.Errorf("fn's context is open after Do returned (Err = %v)", ctx.Err())
	}
}

// Goroutines the handler started use its context (every method, and
// contexts derived from it) while the answer is stored and the context
// ends: Done closed and Err non-nil always agree, and nothing panics
// (context.WithTimeout panics on a parent whose Done is closed while its
// Err is nil). Run with -race.
func TestHandlerContextEndsConsistently(t *testing.T) {
	for i := range 100 {
		var wg sync.WaitGroup
		stop := make(chan struct{})
		h := idempotency.Middleware(idempotency.Config{Store: &memstore.Store{}, Lease: 20 * time.Millisecond})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			ctx := r.Context()
			for range 4 {
				wg.Go(func() {
					for {
						select {
						case <-stop:
							return
						default:
						}
						_, _ = ctx.Deadline()
						select {
						case <-ctx.Done():
							if ctx.Err() == nil {
								t.Error("Done closed, Err nil")
								return
							}
						default:
						}
						if ctx.Err() != nil {
							select {
							case <-ctx.Done():
							default:
								t.Error("Err non-nil, Done open")
								return
							}
						}
						_ = ctx.Value("x")
						_ = context.Cause(ctx)
						child, cancel := context.WithTimeout(ctx, time.Second)
						cancel()
						_ = child
					}
				})
			}
			time.Sleep(time.Duration(i%25) * time.Millisecond)
		}))
		sendKey(h, "k")
		time.Sleep(time.Millisecond)
		close(stop)
		wg.Wait()
		if t.Failed() {
			return
		}
	}
}

// Many goroutines of one handler wait on its context at once: they share
// one deadline, and all are woken (run with -race).
func TestHandlerContextShared(t *testing.T) {
	h := idempotency.Middleware(idempotency.Config{Store: &memstore.Store{}, Lease: 200 * time.Millisecond})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx := r.Context()
		var wg sync.WaitGroup
		chans := make([]<-chan struct{}, 16)
		for i := range chans {
			wg.Go(func() {
				chans[i] = ctx.Done()
				select {
				case <-chans[i]:
				case <-time.After(10 * time.Second):
				}
				if !errors.Is(context.Cause(ctx), idempotency.ErrLeaseEnding) {
					t.Errorf("goroutine %d: cause %v", i, context.Cause(ctx))
				}
			})
		}
		wg.Wait()
		for i := range chans {
			if chans[i] != chans[0] {
				t.Fatal("Done gave two channels")
			}
		}
		w.WriteHeader(500)
	}))
	if w := sendKey(h, "k"); w.Code != 500 {
		t.Errorf("= %d; want the handler's 500", w.Code)
	}
}

func sendKey(h http.Handler, key string) *httptest.ResponseRecorder {
	r := httptest.NewRequest(http.MethodPost, "/x", strings.NewReader(`{}`))
	r.Header.Set("Idempotency-Key", key)
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}
