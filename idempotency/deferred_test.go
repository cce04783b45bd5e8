package idempotency_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/onceguard/onceguard/idempotency"
	"github.com/onceguard/onceguard/idempotency/idemstore"
	"github.com/onceguard/onceguard/idempotency/memstore"
)

// beginCounter counts a store's Begins.
type beginCounter struct {
	*memstore.Store
	begins atomic.Int32
}

func (b *beginCounter) Begin(ctx context.Context, r idemstore.BeginRequest) (idemstore.BeginResult, error) {
	b.begins.Add(1)
	return b.Store.Begin(ctx, r)
}

// Deferred on one Guard: a key whose first request runs here is answered
// 409 at once, without the store (a double click never reaches the
// handler's transaction); an answer written without Created is kept
// nowhere ("unrecorded"); the key's next request, finished moments ago
// here, takes the deferred path again (no Begin): only the handler's
// transaction checks the principal.
func TestDeferredLocal(t *testing.T) {
	store := &beginCounter{Store: &memstore.Store{}}
	var events []string
	entered, release := make(chan struct{}), make(chan struct{})
	var runs atomic.Int32
	h := idempotency.Middleware(idempotency.Config{Store: store, Deferred: true,
		OnEvent: func(_ *http.Request, ev string) { events = append(events, ev) }})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		call, _ := idempotency.FromContext(r.Context())
		if runs.Add(1) == 1 {
			if call.Start() == nil {
				t.Error("the first request's Call has no Start")
			}
			close(entered)
			<-release
			http.Error(w, "session ended", http.StatusUnauthorized) // refused before creating the record
			return
		}
		w.WriteHeader(http.StatusCreated)
		w.Write([]byte("made"))
	}))
	post := func() *httptest.ResponseRecorder {
		r := httptest.NewRequest(http.MethodPost, "/pay", strings.NewReader(`{}`))
		r.Header.Set("Idempotency-Key", "k1")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w
	}
	first := make(chan *httptest.ResponseRecorder)
	go func() { first <- post() }()
	<-entered
	if w := post(); w.Code != http.StatusConflict || store.begins.Load() != 0 {
		t.Fatalf("the key again while its first request runs = %d, %d Begins; want 409 and none", w.Code, store.begins.Load())
	}
	close(release)
	if w := <-first; w.Code != http.StatusUnauthorized {
		t.Fatalf("first = %d; want its 401", w.Code)
	}
	if w := post(); w.Code != http.StatusCreated || w.Body.String() != "made" || store.begins.Load() != 0 {
		t.Fatalf("the key after its unrecorded first = %d %q, %d Begins; want 201 made, none (deferred again)", w.Code, w.Body, store.begins.Load())
	}
	want := "in_progress unrecorded unrecorded"
	if got := strings.Join(events, " "); got != want {
		t.Errorf("events = %q; want %q", got, want)
	}
}
