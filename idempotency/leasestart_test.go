package idempotency_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/onceguard/onceguard/idempotency"
	"github.com/onceguard/onceguard/idempotency/idemstore"
	"github.com/onceguard/onceguard/idempotency/memstore"
)

// A Deferred retry that waited (Options.Wait) for its key's first request
// here, then got the key from the store, runs its handler with a context
// that must end inside the lease the store gave it: no other request may
// take the key over while that context is live.
func TestDeferredWaitLeaseCoversContext(t *testing.T) {
	const lease, wait = time.Second, 800 * time.Millisecond
	store := &memstore.Store{}
	fp, _ := idempotency.Fingerprint([]byte(`{}`))
	id := idempotency.RecordID(idempotency.Scope{Method: http.MethodPost, Path: "/pay"}, "kw")
	entered, release := make(chan struct{}), make(chan struct{})
	var runs atomic.Int32
	var probe idemstore.BeginResult
	var deadline time.Time
	h := idempotency.Middleware(idempotency.Config{Store: store, Deferred: true, Lease: lease, Wait: wait})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if runs.Add(1) == 1 {
			close(entered)
			<-release
			http.Error(w, "refused", http.StatusBadRequest) // nothing created: unrecorded
			return
		}
		// The retry: the Guard created its record. Just before its
		// context ends, another request with the key comes.
		deadline, _ = r.Context().Deadline()
		probe, _ = store.Begin(context.Background(), idemstore.BeginRequest{ID: id, Fingerprint: fp, Lease: lease, TTL: time.Hour, Now: deadline.Add(-time.Millisecond)})
		w.WriteHeader(http.StatusCreated)
	}))
	post := func() *httptest.ResponseRecorder {
		r := httptest.NewRequest(http.MethodPost, "/pay", strings.NewReader(`{}`))
		r.Header.Set("Idempotency-Key", "kw")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w
	}
	first := make(chan *httptest.ResponseRecorder)
	go func() { first <- post() }()
	<-entered
	second := make(chan *httptest.ResponseRecorder)
	go func() { second <- post() }()
	time.Sleep(wait / 2) // the retry waits on the first here
	close(release)
	<-first
	<-second
	if runs.Load() != 2 {
		t.Fatalf("handler ran %d times; want 2", runs.Load())
	}
	if probe.Outcome != idemstore.InProgress {
		t.Errorf("a request with the key just before the retry's handler context ends (%v) = outcome %d (recovered %v); want InProgress (%d): the store's lease ran out while the handler's context was live",
			deadline.Format(time.StampMilli), probe.Outcome, probe.Recovered, idemstore.InProgress)
	}
}

// slowBegin answers Begin late: the store made its record at once (with
// the lease from r.Now), but its answer takes a while to come back (a
// busy database, a lock wait, a retried statement, a slow network).
type slowBegin struct {
	*memstore.Store
	delay time.Duration
}

func (s *slowBegin) Begin(ctx context.Context, r idemstore.BeginRequest) (idemstore.BeginResult, error) {
	res, err := s.Store.Begin(ctx, r)
	time.Sleep(s.delay)
	return res, err
}

// fn's context must end inside the lease the store gave the key, however
// long Begin's answer took: else a redelivery takes the key over and runs
// fn again while the first fn, its context still live, runs too.
func TestDoSlowBeginLeaseCoversContext(t *testing.T) {
	const lease = time.Second
	store := &slowBegin{Store: &memstore.Store{}, delay: 300 * time.Millisecond}
	scope := idempotency.Scope{Method: "job", Path: "/slow"}
	var probe idemstore.BeginResult
	var deadline time.Time
	_, _, err := idempotency.Do(context.Background(), store, scope, "ks", "fp", &idempotency.DoOptions{Lease: lease}, func(ctx context.Context) ([]byte, error) {
		deadline, _ = ctx.Deadline()
		probe, _ = store.Store.Begin(context.Background(), idemstore.BeginRequest{ID: idempotency.RecordID(scope, "ks"), Fingerprint: "fp", Lease: lease, TTL: time.Hour, Now: deadline.Add(-time.Millisecond)})
		return []byte("ok"), nil
	})
	_ = err
	if probe.Outcome != idemstore.InProgress {
		t.Errorf("a redelivery just before fn's context ends (%v) = outcome %d (recovered %v); want InProgress (%d): the lease ran out while fn's context was live",
			deadline.Format(time.StampMilli), probe.Outcome, probe.Recovered, idemstore.InProgress)
	}
}
