package idemhertz_test

import (
	"context"
	"errors"
	"io"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/cloudwego/hertz/pkg/app"
	"github.com/cloudwego/hertz/pkg/app/server"

	"github.com/onceguard/onceguard/idempotency"
	"github.com/onceguard/onceguard/idempotency/idemhertz"
	"github.com/onceguard/onceguard/idempotency/memstore"
)

// counting yields n spaces then fails with err (nil: EOF), counting what was read.
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

func streamed(t *testing.T, body io.Reader, h app.HandlerFunc) *app.RequestContext {
	t.Helper()
	s := server.New(server.WithStreamBody(true))
	s.Use(idemhertz.New(idempotency.Options[*app.RequestContext]{Store: &memstore.Store{},
		Fingerprint: func(_ *app.RequestContext, b []byte) (string, error) { return string(b), nil }}))
	s.POST("/pay", h)
	c := s.Engine.NewContext()
	c.Request.Header.SetMethod("POST")
	c.Request.SetRequestURI("/pay")
	c.Request.Header.Set("Idempotency-Key", "8e03978e-40d5-43e8-bc93-6894a57f9324")
	c.Request.SetBodyStream(body, -1)
	s.Engine.ServeHTTP(context.Background(), c)
	return c
}

// With a streamed request body, a body far over MaxBody is answered 413
// as on net/http, which reads MaxBody+1 bytes: not buffered whole first.
func TestStreamedBodyReadBounded(t *testing.T) {
	body := &counting{left: 64 << 20}
	c := streamed(t, body, func(ctx context.Context, c *app.RequestContext) { c.Status(201) })
	if got := c.Response.StatusCode(); got != 413 {
		t.Fatalf("status %d; want 413", got)
	}
	if n := body.read.Load(); n > 1<<20 {
		t.Fatalf("the guard read %d bytes of the body to answer 413 (MaxBody is %d)", n, idempotency.DefaultMaxBody)
	}
}

// A streamed body that cannot be read is 400 invalid_request on net/http,
// before any key is used; here the guard must not fingerprint it as empty
// and run the handler.
func TestStreamedBodyUnreadable(t *testing.T) {
	var ran atomic.Bool
	c := streamed(t, &counting{left: 10, err: errors.New("connection reset")}, func(ctx context.Context, c *app.RequestContext) {
		ran.Store(true)
		c.Status(201)
	})
	if ran.Load() {
		t.Fatalf("the handler ran (status %d) on an unreadable body", c.Response.StatusCode())
	}
	if st := c.Response.StatusCode(); st != 400 || !strings.Contains(string(c.Response.Body()), "invalid_request") {
		t.Fatalf("answer %d %s; want 400 invalid_request", st, c.Response.Body())
	}
}

// A streamed body within MaxBody still reaches the handler whole.
func TestStreamedBodyReachesHandler(t *testing.T) {
	var got atomic.Value
	c := streamed(t, strings.NewReader(`{"amount":1}`), func(ctx context.Context, c *app.RequestContext) {
		got.Store(string(c.Request.Body()))
		c.Status(201)
	})
	if b, _ := got.Load().(string); c.Response.StatusCode() != 201 || b != `{"amount":1}` {
		t.Fatalf("status %d, handler body %q", c.Response.StatusCode(), b)
	}
}
