// Package idemgin is the gin adapter of idempotency.Guard: the
// Idempotency-Key checks of package idempotency as a gin.HandlerFunc.
//
// Use it as any gin middleware, on the engine, a group or a route:
//
//	r.POST("/payments", idemgin.New(idempotency.Options[*gin.Context]{Store: store}), pay)
//
// The handlers after it run with their answer buffered (c.Writer is a
// buffering gin.ResponseWriter until they return), so that what is stored
// is exactly what is sent; a retry with the same key gets that answer
// byte for byte, with Idempotent-Replayed: true, and the handlers do not
// run. c.Request carries the keyed request's context, so
// idempotency.FromContext(c.Request.Context()) returns its Call (and so
// does FromContext(c) when the engine's ContextWithFallback is set), and a
// body that can be read again. A problem (400, 409, 422, 429, 503, ...)
// or a replay aborts the chain. A handler that panics frees the key, then
// the panic goes on to gin's Recovery, which answers it.
package idemgin

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"net"
	"net/http"

	"github.com/gin-gonic/gin"

	"github.com/onceguard/onceguard/idempotency"
)

// New returns gin middleware that guards the handlers after it with the
// Guard of o; the hooks of o (Principal, Fingerprint, OnEvent) get the
// request's *gin.Context. It panics where idempotency.NewGuard does.
func New(o idempotency.Options[*gin.Context]) gin.HandlerFunc {
	if o.Deferred { // it would need Guard.Resume: a refused call would be answered an empty 200
		panic("idemgin: Options.Deferred is supported by idempotency.Middleware only")
	}
	g := idempotency.NewGuard(o)
	return func(c *gin.Context) {
		r := c.Request
		body, err := idempotency.ReadBody(r, g.MaxBody())
		if err != nil {
			idempotency.WriteProblem(c.Writer, errUnreadable)
			c.Abort()
			return
		}
		req := idempotency.Request{Method: r.Method, Path: r.URL.Path, Key: r.Header["Idempotency-Key"],
			ContentType: r.Header.Get("Content-Type"), Body: body}
		out := g.Begin(r.Context(), c, &req)
		switch {
		case out.Problem != nil:
			idempotency.WriteProblem(c.Writer, out.Problem)
			c.Abort()
			return
		case out.Replay != nil:
			idempotency.WriteReplay(c.Writer, out.Replay, out.Expires)
			c.Abort()
			return
		case out.Call == nil: // no key on a KeyOptional route: unprotected
			r.Body = io.NopCloser(bytes.NewReader(body))
			c.Next()
			return
		}
		call := out.Call
		w := &writer{rec: idempotency.NewRecorder(), out: c.Writer}
		serve(c, g, call, w, r.WithContext(call.Context()), body)
		a := w.rec.Answer()
		if p := g.Finish(c, call, a); p != nil {
			idempotency.WriteProblem(c.Writer, p)
			return
		}
		g.WriteFirst(c.Writer, a, out.Expires)
	}
}

// serve runs the rest of the chain on w and hr, then gives c its writer
// and request back; a panic frees the key first, then goes on with c's
// own writer, for gin's Recovery to answer on.
func serve(c *gin.Context, g *idempotency.Guard[*gin.Context], call *idempotency.Call, w *writer, hr *http.Request, body []byte) {
	orig, origReq := c.Writer, c.Request
	defer func() {
		c.Writer, c.Request = orig, origReq
		if v := recover(); v != nil {
			g.Abort(c, call)
			panic(v)
		}
	}()
	hr.Body = call.Body(body)
	c.Writer, c.Request = w, hr
	c.Next()
	w.end()
}

var errUnreadable = &idempotency.Problem{Status: http.StatusBadRequest, Code: "invalid_request", Title: "Unreadable body",
	Detail: "the request body could not be read"}

// writer is the handlers' gin.ResponseWriter: gin's semantics (the last
// status set before the first byte wins; Written and Size count what was
// written), on an idempotency.Recorder. The status goes to the Recorder
// when gin's would go to the wire: at the first write, at WriteHeaderNow or
// Flush, or when the chain ends.
type writer struct {
	rec    *idempotency.Recorder
	out    gin.ResponseWriter // the real one: for CloseNotify
	status int                // set, not yet written; 0: none
}

var _ gin.ResponseWriter = (*writer)(nil)

func (w *writer) Header() http.Header { return w.rec.Header() }

func (w *writer) WriteHeader(code int) {
	if code > 0 && !w.rec.Written() {
		w.status = code
	}
}

func (w *writer) WriteHeaderNow() {
	if !w.rec.Written() {
		w.rec.WriteHeader(w.Status())
	}
}

func (w *writer) Write(p []byte) (int, error) {
	w.WriteHeaderNow()
	return w.rec.Write(p)
}

func (w *writer) WriteString(s string) (int, error) {
	w.WriteHeaderNow()
	return w.rec.WriteString(s)
}

func (w *writer) Status() int {
	switch {
	case w.rec.Written():
		return w.rec.Status()
	case w.status != 0:
		return w.status
	}
	return http.StatusOK
}

func (w *writer) Size() int {
	if !w.rec.Written() {
		return -1
	}
	return w.rec.Size()
}

func (w *writer) Written() bool { return w.rec.Written() }

// Flush writes the status, as gin's does; the body is sent once stored.
func (w *writer) Flush() { w.WriteHeaderNow() }

// Hijack refuses: a guarded answer is buffered to be stored, and a
// hijacked connection has none.
func (w *writer) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	return nil, nil, errHijack
}

var errHijack = errors.New("idemgin: a guarded request's connection cannot be hijacked")

func (w *writer) CloseNotify() <-chan bool { return w.out.CloseNotify() }

// Pusher returns nil: a push is no part of a stored answer.
func (w *writer) Pusher() http.Pusher { return nil }

// end writes a status set and not written when the chain ends, as gin
// does after the last handler; with none, the answer is "nothing
// written".
func (w *writer) end() {
	if w.status != 0 {
		w.WriteHeaderNow()
	}
}
