package idempotency_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/onceguard/onceguard/idempotency"
	"github.com/onceguard/onceguard/idempotency/idemstore"
	"github.com/onceguard/onceguard/idempotency/memstore"
	"github.com/onceguard/onceguard/token"
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

// Deferred on one Guard, with a repeat-submit window: the same body under
// another key is turned away 429 at once, its handler never run, while
// the first runs and after it created its record, as Begin's claim does
// without Deferred; a first whose key was freed (a 5xx) or that created
// nothing lets the window go here.
func TestDeferredLocalWindow(t *testing.T) {
	store := &memstore.Store{}
	tokens := token.New(store, nil)
	// Another instance, without Deferred or a window, made records first:
	// a key answered 201 "old", a submit token used on another path.
	user := func(*http.Request) (string, error) { return "u1", nil }
	plain := idempotency.Middleware(idempotency.Config{Store: store, Tokens: tokens, Purpose: "withdrawal", Principal: user})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
		w.Write([]byte("old"))
	}))
	usedToken, err := tokens.Issue(context.Background(), "u1", "withdrawal")
	if err != nil {
		t.Fatal(err)
	}
	for path, key := range map[string]string{"/pay": "old", "/other": usedToken.Token} {
		r := httptest.NewRequest(http.MethodPost, path, strings.NewReader(`{"a":1}`))
		r.Header.Set("Idempotency-Key", key)
		w := httptest.NewRecorder()
		plain.ServeHTTP(w, r)
		if w.Code != http.StatusCreated {
			t.Fatalf("%s on the other instance = %d", path, w.Code)
		}
	}
	entered, release := make(chan struct{}), make(chan struct{})
	var runs atomic.Int32
	h := idempotency.Middleware(idempotency.Config{Store: store, Tokens: tokens, Purpose: "withdrawal", Principal: user, Deferred: true, Window: time.Minute})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		call, _ := idempotency.FromContext(r.Context())
		body, _ := io.ReadAll(r.Body)
		n := runs.Add(1)
		if n == 1 {
			close(entered)
			<-release
		}
		switch string(body) {
		case `{"a":"fail"}`:
			w.WriteHeader(http.StatusServiceUnavailable) // frees the key and its window
		case `{"a":"refused"}`:
			w.WriteHeader(http.StatusUnauthorized) // created nothing
		case `{"a":"created, then failed"}`:
			call.Created()                               // its transaction committed the record,
			w.WriteHeader(http.StatusServiceUnavailable) // then it failed: the key, its window and the hold go
		default:
			call.Created() // the handler's transaction committed its record
			w.WriteHeader(http.StatusCreated)
		}
	}))
	post := func(key, body string) *httptest.ResponseRecorder {
		r := httptest.NewRequest(http.MethodPost, "/pay", strings.NewReader(body))
		r.Header.Set("Idempotency-Key", key)
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w
	}
	duplicate := func(what string, w *httptest.ResponseRecorder) {
		t.Helper()
		ra, _ := strconv.Atoi(w.Header().Get("Retry-After"))
		if w.Code != http.StatusTooManyRequests || !strings.Contains(w.Body.String(), "duplicate_submission") || ra < 1 || ra > 60 {
			t.Errorf("%s = %d %s, Retry-After %q; want 429 duplicate_submission, 1..60", what, w.Code, w.Body, w.Header().Get("Retry-After"))
		}
	}
	first := make(chan *httptest.ResponseRecorder)
	go func() { first <- post("k1", `{"a":1}`) }()
	<-entered
	duplicate("the same body under k2 while k1 runs", post("k2", `{"a":1}`))
	// The store's answer of a key with a record of its own comes first.
	if w := post("old", `{"a":1}`); w.Code != http.StatusCreated || w.Body.String() != "old" {
		t.Errorf("a retry of an older key with the body k1 holds = %d %q; want its replay, 201 old", w.Code, w.Body)
	}
	if w := post(usedToken.Token, `{"a":1}`); w.Code != http.StatusBadRequest {
		t.Errorf("a token used on another path, with the body k1 holds = %d %s; want 400", w.Code, w.Body)
	}
	duplicate("k2 again, after the store was asked", post("k2", `{"a":1}`))
	// A key whose earlier attempt crashed with the same body (its record's
	// lease ran out) is the store's to answer: taken over and run, its
	// record kept, not abandoned as a duplicate.
	crashed := idempotency.RecordID(idempotency.Scope{Principal: "u1", Method: http.MethodPost, Path: "/pay"}, "crashed")
	fp, _ := idempotency.Fingerprint([]byte(`{"a":1}`))
	if _, err := store.Begin(context.Background(), idemstore.BeginRequest{ID: crashed, Fingerprint: fp, Lease: time.Millisecond, TTL: time.Hour, Now: time.Now().Add(-time.Minute)}); err != nil {
		t.Fatal(err)
	}
	if w := post("crashed", `{"a":1}`); w.Code != http.StatusCreated {
		t.Errorf("a crashed key's retry with the body k1 holds = %d %s; want 201, run", w.Code, w.Body)
	}
	r := httptest.NewRequest(http.MethodPost, "/pay", strings.NewReader(`{"a":2}`))
	r.Header.Set("Idempotency-Key", "crashed")
	w := httptest.NewRecorder()
	plain.ServeHTTP(w, r)
	if w.Code != http.StatusUnprocessableEntity {
		t.Errorf("the crashed key with another body, after its retry = %d %s; want 422: its record kept", w.Code, w.Body)
	}
	if w := post("k3", `{"a":2}`); w.Code != http.StatusCreated {
		t.Errorf("another body while k1 runs = %d; want 201", w.Code)
	}
	close(release)
	if w := <-first; w.Code != http.StatusCreated {
		t.Fatalf("k1 = %d; want 201", w.Code)
	}
	duplicate("the same body under k4 after k1 created its record", post("k4", `{"a":1}`))
	if got := runs.Load(); got != 3 {
		t.Errorf("handler runs = %d; want 3 (k1, k3, crashed): the duplicates never ran", got)
	}
	for i, body := range []string{`{"a":"fail"}`, `{"a":"refused"}`, `{"a":"created, then failed"}`} {
		if w := post(fmt.Sprint("x1-", i), body); w.Code == http.StatusTooManyRequests || w.Code == http.StatusBadRequest {
			t.Fatalf("%s first = %d", body, w.Code)
		}
		before := runs.Load()
		if w := post(fmt.Sprint("x2-", i), body); w.Code == http.StatusTooManyRequests || runs.Load() != before+1 {
			t.Errorf("%s under a fresh key after its first let the window go = %d, ran %v; want run again", body, w.Code, runs.Load() != before)
		}
	}
}
