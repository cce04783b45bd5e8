package idempotency_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
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
