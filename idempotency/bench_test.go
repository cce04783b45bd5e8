package idempotency_test

import (
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"

	"github.com/onceguard/onceguard/idempotency"
	"github.com/onceguard/onceguard/idempotency/memstore"
)

// What the middleware adds to a trivial handler on the memory store: run
// with -benchmem and compare with BenchmarkBaseline.
func benchHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write([]byte(`{"id":"1"}`))
	})
}

func request(key string) *http.Request {
	r := httptest.NewRequest(http.MethodPost, "/withdrawals", strings.NewReader(`{"amount":"10.00"}`))
	r.Header.Set("Idempotency-Key", key)
	return r
}

func BenchmarkBaseline(b *testing.B) {
	h := benchHandler()
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		h.ServeHTTP(httptest.NewRecorder(), request("k"))
	}
}

func BenchmarkMiddlewareFirstUse(b *testing.B) {
	h := idempotency.Middleware(idempotency.Config{Store: &memstore.Store{}})(benchHandler())
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		h.ServeHTTP(httptest.NewRecorder(), request("key-"+strconv.Itoa(i)))
	}
}

func BenchmarkMiddlewareReplay(b *testing.B) {
	h := idempotency.Middleware(idempotency.Config{Store: &memstore.Store{}})(benchHandler())
	h.ServeHTTP(httptest.NewRecorder(), request("same"))
	b.ReportAllocs()
	for b.Loop() {
		h.ServeHTTP(httptest.NewRecorder(), request("same"))
	}
}
