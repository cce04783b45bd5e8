// Package idemecho is the Echo (v4) adapter of idempotency.Guard: the
// Idempotency-Key checks of package idempotency as an echo.MiddlewareFunc.
//
// Use it as any Echo middleware, on the server, a group or a route:
//
//	e.POST("/payments", pay, idemecho.New(idempotency.Options[echo.Context]{Store: store}))
//
// The handler runs with a Response of its own on a buffer, so that what is
// stored is exactly what is sent; a retry with the same key gets that
// answer byte for byte, with Idempotent-Replayed: true, and the handler
// does not run. An error the handler returns is answered by the server's
// HTTPErrorHandler inside the guard (c.Error), so that its answer is the
// one stored (or, a 5xx, frees the key). c.Request() carries the keyed
// request's context, so idempotency.FromContext(c.Request().Context())
// returns its Call, and a body that can be read again. A problem (400,
// 409, 422, 429, 503, ...) or a replay is answered at once, without the
// handler. A handler that panics frees the key, then the panic goes on to
// the Recover middleware, which answers it.
package idemecho

import (
	"bytes"
	"io"
	"net/http"

	"github.com/labstack/echo/v4"

	"github.com/onceguard/onceguard/idempotency"
)

// New returns Echo middleware that guards the handler with the Guard of
// o; the hooks of o (Principal, Fingerprint, OnEvent) get the request's
// echo.Context. It panics where idempotency.NewGuard does.
func New(o idempotency.Options[echo.Context]) echo.MiddlewareFunc {
	if o.Deferred { // it would need Guard.Resume: a refused call would be answered an empty 200
		panic("idemecho: Options.Deferred is supported by idempotency.Middleware only")
	}
	g := idempotency.NewGuard(o)
	return func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error {
			r := c.Request()
			body, err := idempotency.ReadBody(r, g.MaxBody())
			if err != nil {
				idempotency.WriteProblem(c.Response(), errUnreadable)
				return nil
			}
			req := idempotency.Request{Method: r.Method, Path: r.URL.Path, Key: r.Header["Idempotency-Key"],
				ContentType: r.Header.Get("Content-Type"), Body: body}
			out := g.Begin(r.Context(), c, &req)
			switch {
			case out.Problem != nil:
				idempotency.WriteProblem(c.Response(), out.Problem)
				return nil
			case out.Replay != nil:
				idempotency.WriteReplay(c.Response(), out.Replay, out.Expires)
				return nil
			case out.Call == nil: // no key on a KeyOptional route: unprotected
				r.Body = io.NopCloser(bytes.NewReader(body))
				return next(c)
			}
			call := out.Call
			rec := idempotency.NewRecorder()
			serve(c, g, call, next, rec, r.WithContext(call.Context()), body)
			a := rec.Answer()
			if p := g.Finish(c, call, a); p != nil {
				idempotency.WriteProblem(c.Response(), p)
				return nil
			}
			g.WriteFirst(c.Response(), a, out.Expires)
			return nil
		}
	}
}

// serve runs next on a Response on rec and on hr, answering its error
// there, then gives c its Response and request back; a panic frees the
// key first, then goes on with c's own Response, for Recover to answer on.
func serve(c echo.Context, g *idempotency.Guard[echo.Context], call *idempotency.Call, next echo.HandlerFunc, rec *idempotency.Recorder, hr *http.Request, body []byte) {
	orig, origReq := c.Response(), c.Request()
	defer func() {
		c.SetResponse(orig)
		c.SetRequest(origReq)
		if v := recover(); v != nil {
			g.Abort(c, call)
			panic(v)
		}
	}()
	hr.Body = call.Body(body)
	c.SetRequest(hr)
	c.SetResponse(echo.NewResponse(rec, c.Echo()))
	if err := next(c); err != nil {
		c.Error(err) // on rec: the error's answer is the one stored
	}
}

var errUnreadable = &idempotency.Problem{Status: http.StatusBadRequest, Code: "invalid_request", Title: "Unreadable body",
	Detail: "the request body could not be read"}
