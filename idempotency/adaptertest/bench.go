package adaptertest

import (
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"
)

// benchJSON is the body of the requests Benchmark sends.
const benchJSON = `{"amount":"10.00"}`

// Benchmark times h, called in process as a server calls it, on b.N
// requests POST /withdrawals with a small JSON body and,
// with replay false, a fresh Idempotency-Key each (key-0, key-1, ...);
// with replay true, the same key, first sent once before the timer
// starts, so that each timed request is a replay. h's handler answers
// 201: Benchmark fails unless the last answer is 201 with
// Idempotent-Replayed: true for a replay, and without it otherwise.
//
// The harness allocates nothing per request: one reused request whose
// body and key are reset before each call, one reused response writer
// whose header map is emptied, and the keys made before the timer
// starts, into one string (a slice of b.N strings would make the side
// that allocates more pay for the harness's heap, scanned on every
// collection). So the difference between a guarded h and the same h
// without the guard is the guard's alone; the benchmarks of every
// adapter on net/http types use it, and net/http's own Middleware's.
func Benchmark(b *testing.B, h http.Handler, replay bool) {
	key, want := func(i int) string { return "key-" + strconv.Itoa(i) }, ""
	if replay {
		key, want = func(int) string { return "same" }, "true"
		r := benchRequest(b)
		r.Body = &benchBody{*strings.NewReader(benchJSON)}
		r.Header.Set("Idempotency-Key", "same")
		h.ServeHTTP(&benchSink{header: make(http.Header)}, r)
	}
	var (
		all    strings.Builder
		bounds = make([]int32, b.N+1) // key i is all[bounds[i]:bounds[i+1]]
	)
	for i := range b.N {
		all.WriteString(key(i))
		bounds[i+1] = int32(all.Len())
	}
	keys := all.String()
	var bd benchBody
	r := benchRequest(b)
	value := []string{""}
	r.Header["Idempotency-Key"] = value
	w := &benchSink{header: make(http.Header)}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		bd.Reset(benchJSON)
		r.Body = &bd
		value[0] = keys[bounds[i]:bounds[i+1]]
		clear(w.header)
		w.code = 0
		h.ServeHTTP(w, r)
	}
	b.StopTimer()
	if w.code != http.StatusCreated || w.header.Get("Idempotent-Replayed") != want {
		b.Fatalf("last answer %d, Idempotent-Replayed %q; want 201, %q", w.code, w.header.Get("Idempotent-Replayed"), want)
	}
}

// benchBody is a request body that can be rewound.
type benchBody struct{ strings.Reader }

func (*benchBody) Close() error { return nil }

// benchSink is a response writer that keeps the status and discards the
// body.
type benchSink struct {
	header http.Header
	code   int
}

func (s *benchSink) Header() http.Header         { return s.header }
func (s *benchSink) WriteHeader(code int)        { s.code = code }
func (s *benchSink) Write(p []byte) (int, error) { return len(p), nil }

func benchRequest(b testing.TB) *http.Request {
	r := &http.Request{Method: http.MethodPost, URL: &url.URL{Path: "/withdrawals"}, Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header: http.Header{"Content-Type": {"application/json"}}, Host: "example.com", ContentLength: int64(len(benchJSON)),
		RequestURI: "/withdrawals"}
	return r.WithContext(b.Context())
}
