package idempotency_test

import (
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/onceguard/onceguard/idempotency"
	"github.com/onceguard/onceguard/idempotency/adaptertest"
	"github.com/onceguard/onceguard/idempotency/memstore"
)

// What the middleware adds to a trivial handler on the memory store: run
// with -benchmem and subtract BenchmarkBaseline from BenchmarkMiddleware*
// (ns/op and allocs/op). All three run the harness every adapter's
// benchmarks run, adaptertest.Benchmark: one reused request whose body
// and Idempotency-Key are reset before each call, and one reused response
// writer whose header map is emptied, so that the harness itself
// allocates nothing per request and the difference is the middleware's
// alone. Every iteration of BenchmarkBaseline and
// BenchmarkMiddlewareFirstUse uses a fresh key (made before the timer
// starts); BenchmarkMiddlewareReplay replays one.
func benchHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write([]byte(`{"id":"1"}`))
	})
}

const benchBody = `{"amount":"10.00"}`

// body is a request body that can be rewound.
type body struct{ strings.Reader }

func (*body) Close() error { return nil }

// sink is a response writer that keeps the status and discards the body.
type sink struct {
	header http.Header
	code   int
	n      int
}

func (s *sink) Header() http.Header         { return s.header }
func (s *sink) WriteHeader(code int)        { s.code = code }
func (s *sink) Write(p []byte) (int, error) { s.n += len(p); return len(p), nil }

func newRequest(b testing.TB) *http.Request {
	r := &http.Request{Method: http.MethodPost, URL: &url.URL{Path: "/withdrawals"}, Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header: http.Header{"Content-Type": {"application/json"}}, Host: "example.com", ContentLength: int64(len(benchBody)), RequestURI: "/withdrawals"}
	return r.WithContext(b.Context())
}

func BenchmarkBaseline(b *testing.B) {
	adaptertest.Benchmark(b, benchHandler(), false)
}

func BenchmarkMiddlewareFirstUse(b *testing.B) {
	adaptertest.Benchmark(b, idempotency.Middleware(idempotency.Config{Store: &memstore.Store{}})(benchHandler()), false)
}

func BenchmarkMiddlewareReplay(b *testing.B) {
	adaptertest.Benchmark(b, idempotency.Middleware(idempotency.Config{Store: &memstore.Store{}})(benchHandler()), true)
}

// BenchmarkMiddlewareFirstUseSteady is BenchmarkMiddlewareFirstUse on a
// store at its steady size: the clock moves 1ms per request and records
// live 100s, so the store holds 100 000 records and drops one (in the
// second's batch) for every one it adds, as a long-running service's
// does once its first TTL has passed. It is filled to that size before
// the timer starts.
func BenchmarkMiddlewareFirstUseSteady(b *testing.B) {
	const live = 100_000
	var clock time.Time = time.Unix(1_700_000_000, 0)
	now := func() time.Time { return clock }
	h := idempotency.Middleware(idempotency.Config{Store: &memstore.Store{}, TTL: live * time.Millisecond, Now: now})(benchHandler())
	tick := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		clock = clock.Add(time.Millisecond)
		h.ServeHTTP(w, r)
	})
	fill := newRequest(b)
	w := &sink{header: make(http.Header)}
	for i := range 2 * live {
		fill.Body = &body{*strings.NewReader(benchBody)}
		fill.Header["Idempotency-Key"] = []string{"fill-" + strconv.Itoa(i)}
		clear(w.header)
		tick.ServeHTTP(w, fill)
	}
	adaptertest.Benchmark(b, tick, false)
}
