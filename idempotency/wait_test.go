package idempotency_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/onceguard/onceguard/idempotency"
	"github.com/onceguard/onceguard/idempotency/memstore"
)

// A retry that waits (Wait) inside a request whose own deadline comes
// first gets the in-flight answer, 409 request_in_progress, as it would
// without Wait: not 503 store_unavailable, which tells the operators a
// store failed when none did.
func TestWaitRequestDeadline(t *testing.T) {
	release := make(chan struct{})
	defer close(release)
	started := make(chan struct{})
	var mu sync.Mutex
	var events []string
	h := idempotency.Middleware(idempotency.Config{Store: &memstore.Store{}, Wait: time.Hour,
		OnEvent: func(_ *http.Request, ev string) { mu.Lock(); events = append(events, ev); mu.Unlock() }})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		close(started)
		<-release
	}))
	go send(h, "k", "", `{}`)
	<-started
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	r := httptest.NewRequestWithContext(ctx, http.MethodPost, "/pay", strings.NewReader(`{}`))
	r.Header.Set("Idempotency-Key", "k")
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	if w.Code != 409 || codeOf(w) != "request_in_progress" {
		t.Errorf("a wait cut by the request's deadline: %d %q; want 409 request_in_progress", w.Code, codeOf(w))
	}
	mu.Lock()
	defer mu.Unlock()
	if got := strings.Join(events, ","); strings.Contains(got, "store_unavailable") {
		t.Errorf("events %s: no store failed", got)
	}
}

// A waiter woken by an abandoned first request (a 5xx frees the key)
// finds that another waiter took the key over, watches again and is
// woken by that one's answer: the handler ran twice (the 5xx, then the
// taker's), every other waiter replays the taker's answer.
func TestWaitRewatchAfterTakeOver(t *testing.T) {
	store := &notified{Store: &memstore.Store{}}
	var runs atomic.Int32
	firstIn, release := make(chan struct{}), make(chan struct{})
	secondIn, release2 := make(chan struct{}), make(chan struct{})
	h := idempotency.Middleware(idempotency.Config{Store: store, Wait: time.Minute})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch runs.Add(1) {
		case 1:
			close(firstIn)
			<-release
			w.WriteHeader(503) // frees the key
		case 2:
			close(secondIn)
			<-release2
			w.WriteHeader(201)
			_, _ = w.Write([]byte("second"))
		default:
			t.Error("a third run")
		}
	}))
	sendAs := func(i int) *httptest.ResponseRecorder {
		r := httptest.NewRequest(http.MethodPost, "/pay", strings.NewReader(`{}`))
		r = r.WithContext(context.WithValue(r.Context(), requestID{}, i))
		r.Header.Set("Idempotency-Key", "k")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w
	}
	first := make(chan *httptest.ResponseRecorder, 1)
	go func() { first <- sendAs(0) }()
	<-firstIn
	const waiters = 3
	answers := make(chan *httptest.ResponseRecorder, waiters)
	for i := 1; i <= waiters; i++ {
		go func() { answers <- sendAs(i) }()
	}
	deadline := time.Now().Add(60 * time.Second)
	for store.inFlight() < waiters && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	close(release)
	if w := <-first; w.Code != 503 {
		t.Fatalf("first: %d; want its 503", w.Code)
	}
	<-secondIn // a waiter took the key over and runs
	close(release2)
	var created, replayed int
	for range waiters {
		switch w := <-answers; {
		case w.Code == 201 && w.Header().Get("Idempotent-Replayed") == "true" && w.Body.String() == "second":
			replayed++
		case w.Code == 201 && w.Header().Get("Idempotent-Replayed") == "":
			created++
		default:
			t.Errorf("waiter: %d %v %q", w.Code, w.Header(), w.Body)
		}
	}
	if created != 1 || replayed != waiters-1 || runs.Load() != 2 {
		t.Errorf("%d taken over, %d replayed, %d runs; want 1, %d, 2", created, replayed, runs.Load(), waiters-1)
	}
}
