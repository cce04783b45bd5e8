// Package idemhertz is the hertz (github.com/cloudwego/hertz) adapter of
// idempotency.Guard: the same checks, in the same order, with the same
// answers as idempotency.Middleware, for hertz handlers.
//
// New returns an app.HandlerFunc to put in front of the routes it
// guards (h.Use, or a route group's Use). It reads the request's
// Idempotency-Key header and its raw body, runs Guard.Begin with the
// ctx hertz passed it and then, for a new key, the rest of the chain with
// c.Next(call.Context()). What the chain left in c.Response (status,
// headers, body) is the answer that is stored and sent:
//
//   - The handler's context: the handlers after it get the Call's
//     context as their ctx argument, so idempotency.FromContext(ctx)
//     finds the Call (Forget, MarkCompleted). A handler that starts work
//     meant to outlive the request must not keep it, as with any ctx.
//   - A streamed answer is read whole, stored, then sent whole, as
//     idempotency.Recorder does for net/http: a body stream
//     (c.SetBodyStream), and an answer written straight to the
//     connection, as hertz's net/http adaptor (adaptor.HertzHandler) and
//     a chunked writer (c.Response.HijackWriter) do: while the chain runs
//     the connection's writes are captured and parsed back into the
//     answer. A stream that fails, or a capture that does not parse, is
//     answered 500 internal and frees the key. Hijacking the connection
//     itself (a protocol upgrade) is not supported on a guarded route.
//   - A panic frees the key (Guard.Abort) and is re-raised, for hertz's
//     recovery middleware.
//   - A problem or a replay ends the chain (c.Abort).
//
// hertz reuses a RequestContext once the handler returns: the adapter
// copies what the Guard sees (the body it fingerprints, the key, the
// path, the answer's header values; a Store copies the answer's body it
// keeps) and keeps nothing of it. So do Options' hooks: they get the
// *app.RequestContext, valid only while they run, and copy what they
// return (string(c.GetHeader("X-User")) does).
package idemhertz

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"io"
	"net/http"
	"sync"

	"github.com/cloudwego/hertz/pkg/app"
	"github.com/cloudwego/hertz/pkg/network"
	"github.com/cloudwego/hertz/pkg/protocol"

	"github.com/onceguard/onceguard/idempotency"
)

// New returns hertz middleware that enforces Idempotency-Key on every
// request it handles, as idempotency.Middleware does for net/http. It
// panics where idempotency.NewGuard does.
func New(o idempotency.Options[*app.RequestContext]) app.HandlerFunc {
	if o.Deferred { // it would need Guard.Resume: a refused call would be answered an empty 200
		panic("idemhertz: Options.Deferred is supported by idempotency.Middleware only")
	}
	g := idempotency.NewGuard(o)
	return func(ctx context.Context, c *app.RequestContext) { serve(g, ctx, c) }
}

// defaultContentType is the Content-Type hertz gives an answer that set none.
const defaultContentType = "text/plain; charset=utf-8"

// probStream answers a streamed answer that could not be read.
var probStream = &idempotency.Problem{Status: http.StatusInternalServerError, Code: "internal", Title: "Internal error",
	Detail: "the handler's streamed answer could not be read; nothing was stored, so a retry with this key runs again"}

func serve(g *idempotency.Guard[*app.RequestContext], ctx context.Context, c *app.RequestContext) {
	hr := &c.Request
	body, err := rawBody(hr, g.MaxBody())
	if err != nil {
		c.Abort()
		writeProblem(c, errUnreadable)
		return
	}
	// Begin keeps a copy: the stack reuses its buffers.
	req := g.RawRequest(hr.Header.Method(), hr.URI().Path(), hr.Header.PeekAll("Idempotency-Key"),
		hr.Header.ContentType(), body)

	out := g.Begin(ctx, c, &req)
	switch {
	case out.Problem != nil:
		c.Abort()
		writeProblem(c, out.Problem)
		return
	case out.Replay != nil:
		c.Abort()
		for k, vs := range idempotency.ReplayHeader(out.Replay, out.Expires) {
			setHeader(&c.Response.Header, k, vs)
		}
		c.Response.SetStatusCode(out.Replay.Status)
		c.Response.SetBody(out.Replay.Body)
		return
	case out.Call == nil: // no key, and none needed: unprotected
		c.Next(ctx)
		return
	}
	call := out.Call

	resp := &c.Response
	saved := before.Get().(*protocol.ResponseHeader)
	defer func() { saved.Reset(); before.Put(saved) }()
	resp.Header.CopyTo(saved)

	conn := c.GetConn()
	capt := captures.Get().(*capture)
	defer capt.recycle()
	capt.Conn = conn
	if tc, ok := conn.(network.ConnTLSer); ok {
		c.SetConn(&tlsCapture{capt, tc}) // the TLS state stays visible (adaptor.HertzHandler's r.TLS)
	} else {
		c.SetConn(capt)
	}
	next(g, ctx, c, call, conn)
	c.SetConn(conn)

	if !settle(c, capt) {
		g.Abort(c, call)
		saved.CopyTo(&resp.Header)
		writeProblem(c, probStream)
		return
	}
	status := resp.StatusCode()
	rb := resp.Body()
	ah := idempotency.NewHeaderCollector()
	defer ah.Release()
	empty := len(rb) == 0
	resp.Header.VisitAll(func(k, v []byte) {
		if empty && string(k) == "Content-Type" && string(v) == defaultContentType {
			// hertz's default, which it does not send with an empty
			// body: not stored, so that a replay does not send it either.
			return
		}
		ah.Add(k, v)
	})
	a := ah.Answer(status, rb)
	if p := g.Finish(c, call, a); p != nil {
		saved.CopyTo(&resp.Header)
		writeProblem(c, p)
		return
	}
	// The answer is already in c.Response: add what a first answer gets.
	for k, vs := range g.FirstExtra(ah, out.Expires) {
		setHeader(&resp.Header, k, vs)
	}
}

var errUnreadable = &idempotency.Problem{Status: http.StatusBadRequest, Code: "invalid_request", Title: "Unreadable body",
	Detail: "the request body could not be read"}

// rawBody returns the request's body, as idempotency.ReadBody does: with a
// streamed body (server.WithStreamBody), up to limit+1 bytes of the stream
// (more is 413, and the rest is never read), an error as an error (Body
// would hide it as an empty body); a whole one is set back as the body,
// for the handler.
func rawBody(hr *protocol.Request, limit int64) ([]byte, error) {
	if !hr.IsBodyStream() {
		return hr.BodyE()
	}
	b, err := io.ReadAll(io.LimitReader(hr.BodyStream(), limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(b)) <= limit {
		hr.SetBody(b)
	}
	return b, nil
}

// next runs the rest of the chain with the Call's context; a panic
// puts the connection back, frees the key, then is re-raised.
func next(g *idempotency.Guard[*app.RequestContext], ctx context.Context, c *app.RequestContext, call *idempotency.Call, conn network.Conn) {
	defer func() {
		if v := recover(); v != nil {
			c.SetConn(conn)
			c.Response.HijackWriter(nil) // what it wrote was captured: the recovery's answer goes out instead
			g.Abort(c, call)
			panic(v)
		}
	}()
	c.Next(call.Context())
}

// settle turns what the chain left into a plain buffered answer in
// c.Response: a body stream read whole, or an answer written to the
// (captured) connection parsed back. It reports false when that failed.
func settle(c *app.RequestContext, capt *capture) bool {
	resp := &c.Response
	if hw := resp.GetHijackWriter(); hw != nil {
		// Written to the connection: its writer writes into capt.
		err := hw.Finalize()
		resp.HijackWriter(nil)
		capt.settle()
		if err != nil {
			return false
		}
		if capt.buf.Len() == 0 { // a writer that wrote nothing: the answer is c.Response
			return true
		}
		pr, err := http.ReadResponse(bufio.NewReader(bytes.NewReader(capt.buf.Bytes())), nil)
		if err != nil {
			return false
		}
		b, err := io.ReadAll(pr.Body)
		if err != nil {
			return false
		}
		resp.Header.SetStatusCode(pr.StatusCode)
		resp.Header.Del("Transfer-Encoding")
		resp.SetBody(b)
		resp.Header.SetContentLength(len(b))
		return true
	}
	capt.settle()
	if capt.buf.Len() > 0 {
		return false // bytes on the connection without a hijack writer: no answer to tell
	}
	if resp.IsBodyStream() {
		var b bytes.Buffer
		if err := resp.BodyWriteTo(&b); err != nil {
			return false
		}
		resp.SetBody(b.Bytes())
		resp.Header.SetContentLength(b.Len())
	}
	return true
}

// writeProblem replaces the response's status and body with p, as
// application/problem+json. After the chain ran, the caller first puts
// back the header as it was before (say, CORS from a middleware in
// front): none of the handler's headers (a Set-Cookie) go out with it.
func writeProblem(c *app.RequestContext, p *idempotency.Problem) {
	resp := &c.Response
	resp.ResetBody()
	h, body := idempotency.ProblemBody(p)
	for k, vs := range h {
		setHeader(&resp.Header, k, vs)
	}
	resp.SetStatusCode(p.Status)
	resp.SetBody(body)
}

// setHeader sets the header k to vs on a hertz response header.
func setHeader(h *protocol.ResponseHeader, k string, vs []string) {
	for i, v := range vs {
		if i == 0 {
			h.Set(k, v)
		} else {
			h.Add(k, v)
		}
	}
}

// before keeps a response's header as it was before the chain ran, to
// put back under a problem that replaces the handler's answer.
var before = sync.Pool{New: func() any { return new(protocol.ResponseHeader) }}

// capture is the connection the chain sees: reads, addresses and
// deadlines are the real connection's; writes are kept, to be parsed back
// into the answer, so that what is stored is what is sent.
type capture struct {
	network.Conn
	buf     bytes.Buffer
	pending [][]byte // Malloc'd, filled by the caller: appended in order
}

var captures = sync.Pool{New: func() any { return new(capture) }}

func (c *capture) recycle() {
	c.Conn = nil
	c.pending = c.pending[:0]
	if c.buf.Cap() > idempotency.DefaultMaxBody {
		c.buf = bytes.Buffer{}
	}
	c.buf.Reset()
	captures.Put(c)
}

// settle appends the Malloc'd buffers, now filled, to buf.
func (c *capture) settle() {
	for _, p := range c.pending {
		c.buf.Write(p)
	}
	clear(c.pending)
	c.pending = c.pending[:0]
}

func (c *capture) Malloc(n int) ([]byte, error) {
	b := make([]byte, n)
	c.pending = append(c.pending, b)
	return b, nil
}

func (c *capture) WriteBinary(b []byte) (int, error) {
	c.settle()
	return c.buf.Write(b)
}

func (c *capture) Write(b []byte) (int, error) {
	c.settle()
	return c.buf.Write(b)
}

func (c *capture) Flush() error {
	c.settle()
	return nil
}

// tlsCapture is a capture of a TLS connection: its state stays visible.
type tlsCapture struct {
	*capture
	tls network.ConnTLSer
}

func (c *tlsCapture) Handshake() error                     { return c.tls.Handshake() }
func (c *tlsCapture) ConnectionState() tls.ConnectionState { return c.tls.ConnectionState() }
