package idemhertz_test

import (
	"context"
	"strconv"
	"strings"
	"testing"

	"github.com/cloudwego/hertz/pkg/app"
	"github.com/cloudwego/hertz/pkg/app/server"
	"github.com/cloudwego/hertz/pkg/route"

	"github.com/onceguard/onceguard/idempotency"
	"github.com/onceguard/onceguard/idempotency/idemhertz"
	"github.com/onceguard/onceguard/idempotency/memstore"
)

// What the adapter adds to a trivial hertz handler on the memory store:
// run with -benchmem and subtract BenchmarkBaseline from BenchmarkFirstUse
// and BenchmarkReplay (ns/op, allocs/op). All three call the engine's
// ServeHTTP in memory, as hertz's ut.PerformRequest does but without its
// recorder, with one reused RequestContext whose request is set again
// before each call, so that the harness allocates nothing per request and
// the difference is the adapter's. BenchmarkBaseline and BenchmarkFirstUse
// use a fresh key per iteration (made before the timer starts);
// BenchmarkReplay replays one.

const benchBody = `{"amount":"10.00"}`

func benchEngine(guarded bool) *route.Engine {
	h := server.New()
	if guarded {
		h.Use(idemhertz.New(idempotency.Options[*app.RequestContext]{Store: &memstore.Store{}}))
	}
	h.POST("/withdrawals", func(ctx context.Context, c *app.RequestContext) {
		c.Data(201, "application/json", []byte(`{"id":"1"}`))
	})
	return h.Engine
}

// serve sends one request with key to e, on the reused c.
func serve(e *route.Engine, c *app.RequestContext, key string) {
	c.ResetWithoutConn()
	c.Request.Header.SetMethod("POST")
	c.Request.SetRequestURI("/withdrawals")
	c.Request.Header.SetContentTypeBytes([]byte("application/json"))
	c.Request.Header.Set("Idempotency-Key", key)
	c.Request.SetBodyString(benchBody)
	e.ServeHTTP(context.Background(), c)
}

func bench(b *testing.B, e *route.Engine, key func(i int) string, wantReplayed string) {
	var all strings.Builder
	bounds := make([]int32, b.N+1) // key i is all[bounds[i]:bounds[i+1]]
	for i := range b.N {
		all.WriteString(key(i))
		bounds[i+1] = int32(all.Len())
	}
	keys := all.String()
	c := e.NewContext()
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		serve(e, c, keys[bounds[i]:bounds[i+1]])
	}
	b.StopTimer()
	if c.Response.StatusCode() != 201 || string(c.Response.Header.Peek("Idempotent-Replayed")) != wantReplayed {
		b.Fatalf("last answer %d, Idempotent-Replayed %q; want 201, %q", c.Response.StatusCode(), c.Response.Header.Peek("Idempotent-Replayed"), wantReplayed)
	}
}

func BenchmarkBaseline(b *testing.B) {
	bench(b, benchEngine(false), func(i int) string { return "key-" + strconv.Itoa(i) }, "")
}

func BenchmarkFirstUse(b *testing.B) {
	bench(b, benchEngine(true), func(i int) string { return "key-" + strconv.Itoa(i) }, "")
}

func BenchmarkReplay(b *testing.B) {
	e := benchEngine(true)
	serve(e, e.NewContext(), "same") // the first use, untimed
	bench(b, e, func(int) string { return "same" }, "true")
}
