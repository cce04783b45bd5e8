package idemgin_test

import (
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"

	"github.com/gin-gonic/gin"

	"github.com/onceguard/onceguard/idempotency"
	"github.com/onceguard/onceguard/idempotency/idemgin"
	"github.com/onceguard/onceguard/idempotency/memstore"
)

// The engine's ServeHTTP, with the handler alone or behind the guard on
// the memory store.
func benchEngine(guarded bool) *gin.Engine {
	gin.SetMode(gin.ReleaseMode)
	r := gin.New()
	h := []gin.HandlerFunc{func(c *gin.Context) { c.Data(http.StatusCreated, "application/json", benchBody) }}
	if guarded {
		h = append([]gin.HandlerFunc{idemgin.New(idempotency.Options[*gin.Context]{Store: &memstore.Store{}})}, h...)
	}
	r.POST("/withdrawals", h...)
	return r
}

func BenchmarkBare(b *testing.B)     { bench(b, benchEngine(false), newKey, "") }
func BenchmarkFirstUse(b *testing.B) { bench(b, benchEngine(true), newKey, "") }
func BenchmarkReplay(b *testing.B) {
	h := benchEngine(true)
	replay(b, h)
	bench(b, h, sameKey, "true")
}

// The harness is idempotency's (bench_test.go there): one reused request
// whose body and Idempotency-Key are reset before each call, one reused
// response writer whose header map is emptied, the keys made before the
// timer starts; so the harness allocates nothing per request, and the
// difference between BenchmarkFirstUse or BenchmarkReplay and
// BenchmarkBare is the guard's alone, next to idempotency's
// BenchmarkMiddleware* minus BenchmarkBaseline for net/http.

var benchBody = []byte(`{"id":"1"}`)

const benchRequest = `{"amount":"10.00"}`

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
		Header: http.Header{"Content-Type": {"application/json"}}, Host: "example.com", ContentLength: int64(len(benchRequest)), RequestURI: "/withdrawals"}
	return r.WithContext(b.Context())
}

// bench sends b.N requests to h, the i-th with the key key(i), and checks
// the last answer.
func bench(b *testing.B, h http.Handler, key func(i int) string, wantReplayed string) {
	var (
		all    strings.Builder
		bounds = make([]int32, b.N+1) // key i is all[bounds[i]:bounds[i+1]]
	)
	for i := range b.N {
		all.WriteString(key(i))
		bounds[i+1] = int32(all.Len())
	}
	keys := all.String()
	var bd body
	r := newRequest(b)
	value := []string{""}
	r.Header["Idempotency-Key"] = value
	w := &sink{header: make(http.Header)}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		bd.Reset(benchRequest)
		r.Body = &bd
		value[0] = keys[bounds[i]:bounds[i+1]]
		clear(w.header)
		w.code = 0
		h.ServeHTTP(w, r)
	}
	b.StopTimer()
	if w.code != http.StatusCreated || w.header.Get("Idempotent-Replayed") != wantReplayed {
		b.Fatalf("last answer %d, Idempotent-Replayed %q; want 201, %q", w.code, w.header.Get("Idempotent-Replayed"), wantReplayed)
	}
}

func newKey(i int) string { return "key-" + strconv.Itoa(i) }
func sameKey(int) string  { return "same" }

// replay makes the first use of "same", untimed.
func replay(b *testing.B, h http.Handler) {
	r := newRequest(b)
	r.Body = &body{*strings.NewReader(benchRequest)}
	r.Header.Set("Idempotency-Key", "same")
	h.ServeHTTP(&sink{header: make(http.Header)}, r)
}
