package idempotency_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/onceguard/onceguard/idempotency"
	"github.com/onceguard/onceguard/idempotency/idemstore"
	"github.com/onceguard/onceguard/idempotency/memstore"
	"github.com/onceguard/onceguard/token"
)

// downable is a memstore whose Begin fails while down is set.
type downable struct {
	*memstore.Store
	down atomic.Bool
}

func (s *downable) Begin(ctx context.Context, req idemstore.BeginRequest) (idemstore.BeginResult, error) {
	if s.down.Load() {
		return idemstore.BeginResult{}, fmt.Errorf("dial: %w", idempotency.ErrUnavailable)
	}
	return s.Store.Begin(ctx, req)
}

// OfferToken offers the next token only with an answer after which the
// client submits something new: not with a handler's own 401 (its
// principal is signed out), not with an answer the handler forgot
// (Call.Forget: the same key runs again), not with a 5xx of the store
// (the key and its token stay for the retry).
func TestOfferTokenNotWithRetriedAnswers(t *testing.T) {
	store := &downable{Store: &memstore.Store{}}
	tokens := token.New(store, &token.Options{Key: []byte("a secret of 32 bytes or more, shared by all")})
	h := idempotency.Middleware(idempotency.Config{
		Store: store, Tokens: tokens, Purpose: "withdrawal", RequireToken: true, OfferToken: true,
		Principal: func(*http.Request) (string, error) { return "alice", nil },
	})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/signed-out":
			w.WriteHeader(http.StatusUnauthorized)
		case "/forgotten":
			call, _ := idempotency.FromContext(r.Context())
			call.Forget()
			w.WriteHeader(http.StatusOK)
		default:
			w.WriteHeader(http.StatusCreated)
		}
	}))
	post := func(path string) *httptest.ResponseRecorder {
		t.Helper()
		is, err := tokens.Issue(context.Background(), "alice", "withdrawal")
		if err != nil {
			t.Fatal(err)
		}
		r := httptest.NewRequest(http.MethodPost, path, strings.NewReader(`{"amount":1}`))
		r.Header.Set("Idempotency-Key", is.Token)
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w
	}
	if w := post("/ok"); w.Code != http.StatusCreated || !token.IsToken(w.Header().Get(idempotency.HeaderNextToken)) {
		t.Fatalf("/ok = %d offering %q; want 201 with a token (the offer this test looks for)", w.Code, w.Header().Get(idempotency.HeaderNextToken))
	}
	check := func(what string, w *httptest.ResponseRecorder, status int) {
		t.Helper()
		if w.Code != status {
			t.Errorf("%s = %d; want %d", what, w.Code, status)
		}
		if tok, exp := w.Header().Get(idempotency.HeaderNextToken), w.Header().Get(idempotency.HeaderNextTokenExpires); tok != "" || exp != "" {
			t.Errorf("%s offers %q (expires %q); want no token", what, tok, exp)
		}
	}
	check("the handler's 401", post("/signed-out"), http.StatusUnauthorized)
	check("a forgotten 200", post("/forgotten"), http.StatusOK)
	store.down.Store(true)
	check("the store's 503", post("/ok"), http.StatusServiceUnavailable)
}
