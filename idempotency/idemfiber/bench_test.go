package idemfiber_test

import (
	"strconv"
	"strings"
	"testing"

	"github.com/gofiber/fiber/v2"
	"github.com/valyala/fasthttp"

	"github.com/onceguard/onceguard/idempotency"
	"github.com/onceguard/onceguard/idempotency/idemfiber"
	"github.com/onceguard/onceguard/idempotency/memstore"
)

// What the adapter adds to a trivial fiber handler on the memory store:
// run with -benchmem and subtract BenchmarkBaseline from BenchmarkFirstUse
// and BenchmarkReplay (ns/op, allocs/op). All three call the app's
// fasthttp handler in memory, as fasthttp's server does, with one reused
// RequestCtx whose key and body are set before each call, so that the
// harness allocates nothing per request and the difference is the
// adapter's. BenchmarkBaseline and BenchmarkFirstUse use a fresh key per
// iteration (made before the timer starts); BenchmarkReplay replays one.

const benchBody = `{"amount":"10.00"}`

func benchApp(guarded bool) fasthttp.RequestHandler {
	app := fiber.New()
	if guarded {
		app.Use(idemfiber.New(idempotency.Options[*fiber.Ctx]{Store: &memstore.Store{}}))
	}
	app.Post("/withdrawals", func(c *fiber.Ctx) error {
		c.Set("Content-Type", "application/json")
		return c.Status(fiber.StatusCreated).SendString(`{"id":"1"}`)
	})
	return app.Handler()
}

func newCtx() *fasthttp.RequestCtx {
	var req fasthttp.Request
	req.Header.SetMethod("POST")
	req.SetRequestURI("/withdrawals")
	req.Header.SetContentType("application/json")
	ctx := new(fasthttp.RequestCtx)
	ctx.Init(&req, nil, nil)
	return ctx
}

func bench(b *testing.B, h fasthttp.RequestHandler, key func(i int) string, wantReplayed string) {
	var all strings.Builder
	bounds := make([]int32, b.N+1) // key i is all[bounds[i]:bounds[i+1]]
	for i := range b.N {
		all.WriteString(key(i))
		bounds[i+1] = int32(all.Len())
	}
	keys := all.String()
	ctx := newCtx()
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		ctx.Request.Header.Set("Idempotency-Key", keys[bounds[i]:bounds[i+1]])
		ctx.Request.SetBodyString(benchBody)
		ctx.Response.Reset()
		h(ctx)
	}
	b.StopTimer()
	if ctx.Response.StatusCode() != fiber.StatusCreated || string(ctx.Response.Header.Peek("Idempotent-Replayed")) != wantReplayed {
		b.Fatalf("last answer %d, Idempotent-Replayed %q; want 201, %q", ctx.Response.StatusCode(), ctx.Response.Header.Peek("Idempotent-Replayed"), wantReplayed)
	}
}

func BenchmarkBaseline(b *testing.B) {
	bench(b, benchApp(false), func(i int) string { return "key-" + strconv.Itoa(i) }, "")
}

func BenchmarkFirstUse(b *testing.B) {
	bench(b, benchApp(true), func(i int) string { return "key-" + strconv.Itoa(i) }, "")
}

func BenchmarkReplay(b *testing.B) {
	h := benchApp(true)
	ctx := newCtx() // the first use, untimed
	ctx.Request.Header.Set("Idempotency-Key", "same")
	ctx.Request.SetBodyString(benchBody)
	h(ctx)
	bench(b, h, func(int) string { return "same" }, "true")
}
