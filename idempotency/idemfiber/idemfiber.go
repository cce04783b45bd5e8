// Package idemfiber is the fiber (v2, on fasthttp) adapter of
// idempotency.Guard: the same checks, in the same order, with the same
// answers as idempotency.Middleware, for fiber handlers.
//
// New returns a fiber.Handler to put in front of the routes it guards.
// It reads the request's Idempotency-Key header and its body (the raw
// bytes, as sent: fiber's c.Body() decodes a Content-Encoding, the
// adapter does not, so a compressed JSON body is refused 400
// invalid_json; decode it in a middleware in front if clients compress), runs
// Guard.Begin and then, for a new key, the rest of the chain with
// c.Next(). What the chain left in c.Response() (status, headers, body)
// is the answer that is stored and sent:
//
//   - The handler's context: c.UserContext() is the Call's context while
//     the chain runs, so idempotency.FromContext(c.UserContext()) finds
//     the Call (Forget, MarkCompleted); the user context before is put
//     back afterwards.
//   - A handler that returns an error: the adapter calls the app's
//     ErrorHandler itself (c.App().ErrorHandler, the mounted app's if
//     any) before storing, so the stored answer is the one the client
//     gets, and returns nil; a 5xx from it frees the key as always.
//   - A streamed answer (c.Context().SetBodyStreamWriter, SetBodyStream)
//     is read whole, stored, then sent whole, as idempotency.Recorder
//     does for net/http; a stream that fails is answered 500 internal
//     and the key is freed.
//   - A panic frees the key (Guard.Abort) and is re-raised, for fiber's
//     recover middleware or the server.
//   - A problem or a replay ends the chain: c.Next() is not called.
//
// fasthttp reuses a request's Ctx and buffers once the handler returns:
// the adapter copies what the Guard sees (the body it fingerprints, the
// key, the path, the answer's header values; a Store copies the answer's
// body it keeps) and keeps nothing of the Ctx. So do Options' hooks:
// they get the *fiber.Ctx, valid only while they run, and the strings of
// c.Get, c.Params and the like are views of fasthttp's buffers (unless
// the app is Immutable): a Principal hook returns a copy,
// strings.Clone(c.Get("X-User")), or a token bound to that principal
// would change under the store.
//
// fasthttp does not cancel a request's context when the client goes
// away: the Guard's context is c.UserContext(), which is
// context.Background() unless a middleware in front set another.
package idemfiber

import (
	"bytes"
	"io"
	"net/http"
	"sync"

	"github.com/gofiber/fiber/v2"
	"github.com/valyala/fasthttp"

	"github.com/onceguard/onceguard/idempotency"
)

// New returns fiber middleware that enforces Idempotency-Key on every
// request it handles, as idempotency.Middleware does for net/http. It
// panics where idempotency.NewGuard does.
func New(o idempotency.Options[*fiber.Ctx]) fiber.Handler {
	if o.Deferred { // it would need Guard.Resume: a refused call would be answered an empty 200
		panic("idemfiber: Options.Deferred is supported by idempotency.Middleware only")
	}
	g := idempotency.NewGuard(o)
	return func(c *fiber.Ctx) error { return serve(g, c) }
}

// defaultContentType is the Content-Type fasthttp gives an answer that set none.
const defaultContentType = "text/plain; charset=utf-8"

// probStream answers a streamed answer that could not be read.
var probStream = &idempotency.Problem{Status: http.StatusInternalServerError, Code: "internal", Title: "Internal error",
	Detail: "the handler's streamed answer could not be read; nothing was stored, so a retry with this key runs again"}

func serve(g *idempotency.Guard[*fiber.Ctx], c *fiber.Ctx) error {
	fr := c.Request()
	body, err := rawBody(fr, g.MaxBody())
	if err != nil {
		writeProblem(c, errUnreadable)
		return nil
	}
	// Begin keeps a copy: the stack reuses its buffers.
	req := g.RawRequest(fr.Header.Method(), fr.URI().Path(), fr.Header.PeekAll("Idempotency-Key"),
		fr.Header.ContentType(), body)

	uctx := c.UserContext()
	out := g.Begin(uctx, c, &req)
	switch {
	case out.Problem != nil:
		writeProblem(c, out.Problem)
		return nil
	case out.Replay != nil:
		resp := c.Response()
		for k, vs := range idempotency.ReplayHeader(out.Replay, out.Expires) {
			setHeader(&resp.Header, k, vs)
		}
		resp.SetStatusCode(out.Replay.Status)
		resp.SetBody(out.Replay.Body)
		return nil
	case out.Call == nil: // no key, and none needed: unprotected
		return c.Next()
	}
	call := out.Call

	resp := c.Response()
	saved := before.Get().(*fasthttp.ResponseHeader)
	defer func() { saved.Reset(); before.Put(saved) }()
	resp.Header.CopyTo(saved)
	c.SetUserContext(call.Context())
	err = next(g, c, call)
	c.SetUserContext(uctx)
	if err != nil {
		// The answer fiber's error handler would write once this returns:
		// written here, so that it is the answer stored.
		if catch := c.App().ErrorHandler(c, err); catch != nil {
			_ = c.SendStatus(fiber.StatusInternalServerError)
		}
	}

	if resp.IsBodyStream() {
		var b bytes.Buffer
		if err := resp.BodyWriteTo(&b); err != nil {
			g.Abort(c, call)
			saved.CopyTo(&resp.Header)
			writeProblem(c, probStream)
			return nil
		}
		resp.SetBody(b.Bytes())
	}
	status := resp.StatusCode()
	rb := resp.Body()
	ah := idempotency.NewHeaderCollector()
	defer ah.Release()
	empty := len(rb) == 0
	resp.Header.VisitAll(func(k, v []byte) {
		if empty && string(k) == "Content-Type" && string(v) == defaultContentType {
			// fasthttp's default, which it does not send with an empty
			// body: not stored, so that a replay does not send it either.
			return
		}
		ah.Add(k, v)
	})
	a := ah.Answer(status, rb)
	if p := g.Finish(c, call, a); p != nil {
		saved.CopyTo(&resp.Header)
		writeProblem(c, p)
		return nil
	}
	// The answer is already in c.Response(): add what a first answer gets.
	for k, vs := range g.FirstExtra(ah, out.Expires) {
		setHeader(&resp.Header, k, vs)
	}
	return nil
}

var errUnreadable = &idempotency.Problem{Status: http.StatusBadRequest, Code: "invalid_request", Title: "Unreadable body",
	Detail: "the request body could not be read"}

// rawBody returns the request's body, as idempotency.ReadBody does: with
// StreamRequestBody, up to limit+1 bytes of the stream (more is 413, and
// the rest is never read), an error as an error (fasthttp's Body would
// make its text the body); a whole one is set back as the body, for the
// handler.
func rawBody(fr *fasthttp.Request, limit int64) ([]byte, error) {
	if !fr.IsBodyStream() {
		return fr.Body(), nil
	}
	b, err := io.ReadAll(io.LimitReader(fr.BodyStream(), limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(b)) <= limit {
		fr.SetBody(b)
	}
	return b, nil
}

// next runs the rest of the chain; a panic frees the key, then is
// re-raised.
func next(g *idempotency.Guard[*fiber.Ctx], c *fiber.Ctx, call *idempotency.Call) (err error) {
	defer func() {
		if v := recover(); v != nil {
			g.Abort(c, call)
			panic(v)
		}
	}()
	return c.Next()
}

// writeProblem replaces the response's status and body with p, as
// application/problem+json. After the chain ran, the caller first puts
// back the header as it was before (say, CORS from a middleware in
// front): none of the handler's headers (a Set-Cookie) go out with it.
func writeProblem(c *fiber.Ctx, p *idempotency.Problem) {
	resp := c.Response()
	resp.ResetBody()
	h, body := idempotency.ProblemBody(p)
	for k, vs := range h {
		setHeader(&resp.Header, k, vs)
	}
	resp.SetStatusCode(p.Status)
	resp.SetBody(body)
}

// setHeader sets the header k to vs on a fasthttp response header.
func setHeader(h interface {
	Set(k, v string)
	Add(k, v string)
}, k string, vs []string) {
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
var before = sync.Pool{New: func() any { return new(fasthttp.ResponseHeader) }}
