package idemfiber_test

import (
	"errors"
	"io"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/gofiber/fiber/v2"
	"github.com/valyala/fasthttp"

	"github.com/onceguard/onceguard/idempotency"
	"github.com/onceguard/onceguard/idempotency/idemfiber"
	"github.com/onceguard/onceguard/idempotency/memstore"
)

// counting yields n bytes of '{' then fails with err (nil: EOF), counting what was read.
type counting struct {
	left int
	err  error
	read atomic.Int64
}

func (c *counting) Read(p []byte) (int, error) {
	if c.left == 0 {
		if c.err != nil {
			return 0, c.err
		}
		return 0, io.EOF
	}
	n := min(len(p), c.left)
	for i := range p[:n] {
		p[i] = ' '
	}
	c.left -= n
	c.read.Add(int64(n))
	return n, nil
}

// raw fingerprints the body as it is (a form, a binary upload).
func raw(_ *fiber.Ctx, b []byte) (string, error) { return string(b), nil }

func streamed(t *testing.T, body io.Reader, h fiber.Handler) *fasthttp.RequestCtx {
	t.Helper()
	app := fiber.New(fiber.Config{DisableStartupMessage: true, StreamRequestBody: true})
	app.Use(idemfiber.New(idempotency.Options[*fiber.Ctx]{Store: &memstore.Store{}, Fingerprint: raw}))
	app.Post("/pay", h)
	var req fasthttp.Request
	req.Header.SetMethod("POST")
	req.SetRequestURI("/pay")
	req.Header.Set("Idempotency-Key", key)
	ctx := new(fasthttp.RequestCtx)
	ctx.Init(&req, nil, nil)
	ctx.Request.SetBodyStream(body, -1) // Init copies no stream
	app.Handler()(ctx)
	return ctx
}

// With StreamRequestBody, a body far over MaxBody (64 KiB) is answered
// 413 as on net/http, which reads MaxBody+1 bytes: the guard must not
// buffer the whole upload first.
func TestStreamedBodyReadBounded(t *testing.T) {
	body := &counting{left: 64 << 20}
	ctx := streamed(t, body, func(c *fiber.Ctx) error { return c.SendStatus(201) })
	if got := ctx.Response.StatusCode(); got != 413 {
		t.Fatalf("status %d; want 413", got)
	}
	if n := body.read.Load(); n > 1<<20 {
		t.Fatalf("the guard read %d bytes of the body to answer 413 (MaxBody is %d)", n, idempotency.DefaultMaxBody)
	}
}

// A streamed body that cannot be read (the client's upload cut short) is
// 400 invalid_request on net/http, before any key is used; the handler
// must not run with fasthttp's error text as its body.
func TestStreamedBodyUnreadable(t *testing.T) {
	var got atomic.Value
	ctx := streamed(t, &counting{left: 10, err: errors.New("connection reset")}, func(c *fiber.Ctx) error {
		got.Store(string(c.Body()))
		return c.SendStatus(201)
	})
	if b, ran := got.Load().(string); ran {
		t.Fatalf("the handler ran (status %d) with body %q", ctx.Response.StatusCode(), b)
	}
	if st := ctx.Response.StatusCode(); st != 400 || !strings.Contains(string(ctx.Response.Body()), "invalid_request") {
		t.Fatalf("answer %d %s; want 400 invalid_request", st, ctx.Response.Body())
	}
}

// A streamed body within MaxBody still reaches the handler whole.
func TestStreamedBodyReachesHandler(t *testing.T) {
	var got atomic.Value
	ctx := streamed(t, strings.NewReader(`{"amount":1}`), func(c *fiber.Ctx) error {
		got.Store(string(c.Body()))
		return c.SendStatus(201)
	})
	if b, _ := got.Load().(string); ctx.Response.StatusCode() != 201 || b != `{"amount":1}` {
		t.Fatalf("status %d, handler body %q", ctx.Response.StatusCode(), b)
	}
}
