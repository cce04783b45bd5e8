package idempotency

import (
	"bytes"
	"context"
	"errors"
	"io"
	"math"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/onceguard/onceguard/idempotency/idemstore"
	"github.com/onceguard/onceguard/token"
)

// Defaults of Config and DoOptions.
const (
	DefaultLease   = 30 * time.Second // Config.Lease, DoOptions.Lease
	DefaultTTL     = 24 * time.Hour   // Config.TTL, DoOptions.TTL
	DefaultMaxBody = 64 << 10         // Config.MaxBody, in bytes
)

// Config configures Middleware: Options for net/http, whose hooks get the
// *http.Request.
type Config = Options[*http.Request]

// Middleware returns net/http middleware that enforces Idempotency-Key on
// every request it wraps, in the order of docs/api.md: body size and
// principal, key syntax, body, submit token, the key's record (replay, 409,
// 422), the repeat-submit window, then the handler. Answers before the
// record is created use up no key and no token. The handler's final answer
// is stored and replayed byte for byte with Idempotent-Replayed: true; a
// 5xx is not stored: the key, its token and its window entry are freed so
// that a retry runs again. A store that cannot be reached answers 503
// store_unavailable: nothing runs without protection. Every answer it
// writes carries Cache-Control: no-store (a replay and an error always;
// the handler's first answer unless the handler set Cache-Control itself),
// so that no cache between client and server answers a retry in its place.
// Problems are written with WriteProblem. It is the net/http adapter of
// Guard; it panics where NewGuard does.
func Middleware(cfg Config) func(http.Handler) http.Handler {
	g := NewGuard(cfg)
	return func(next http.Handler) http.Handler {
		return &middleware{g: g, next: next}
	}
}

type middleware struct {
	g    *Guard[*http.Request]
	next http.Handler
}

func (m *middleware) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	g := m.g
	body, err := readBody(r, g.o.MaxBody)
	if err != nil {
		WriteProblem(w, &Problem{Status: http.StatusBadRequest, Code: "invalid_request", Title: "Unreadable body", Detail: "the request body could not be read"})
		return
	}
	req := Request{Method: r.Method, Path: r.URL.Path, Key: r.Header["Idempotency-Key"], Body: body} // canonical: as Values would look it up
	if g.o.KeyField != "" {
		req.ContentType = r.Header.Get("Content-Type")
	}
	out := g.Begin(r.Context(), r, &req)
	switch {
	case out.Problem != nil:
		WriteProblem(w, out.Problem)
		return
	case out.Replay != nil:
		WriteReplay(w, out.Replay, out.Expires)
		return
	case out.Call == nil: // no key, and none needed
		r.Body = io.NopCloser(bytes.NewReader(body))
		m.next.ServeHTTP(w, r)
		return
	}
	call := out.Call

	// 7. The handler, with its answer buffered so that what is stored is
	// exactly what is sent.
	rec := recorders.Get().(*recorder)
	defer rec.recycle()
	m.serve(rec, r, body, call)
	if call.Refusal() != nil { // Deferred, and the store refused: answer as without it
		rec.reset()
		out = g.Resume(r.Context(), r, &req, call)
		switch {
		case out.Problem != nil:
			WriteProblem(w, out.Problem)
			return
		case out.Replay != nil:
			WriteReplay(w, out.Replay, out.Expires)
			return
		}
		call = out.Call
		m.serve(rec, r, body, call)
	}
	if p := g.Finish(r, call, Answer{Status: rec.status, Header: rec.header, Body: rec.body.Bytes(), Written: rec.wroteHeader}); p != nil {
		WriteProblem(w, p)
		return
	}
	g.WriteFirst(w, Answer{Status: rec.status, Header: rec.header, Body: rec.body.Bytes()}, out.Expires)
}

// serve runs the handler; a panic frees the key, then is re-raised.
func (m *middleware) serve(rec *recorder, r *http.Request, body []byte, call *Call) {
	defer func() {
		if v := recover(); v != nil {
			m.g.Abort(r, call)
			panic(v)
		}
	}()
	call.body.reset(body)
	r.Body = &call.body
	// r.WithContext's copy, made in the Call: no allocation of its own.
	call.req = *r.WithContext((*callCtx)(call))
	m.next.ServeHTTP(rec, &call.req)
}

// recorders recycles answer buffers: a request's recorder is returned
// after its answer was stored (copied) and written out.
var recorders = sync.Pool{New: func() any {
	return &recorder{header: make(http.Header), status: http.StatusOK}
}}

func (r *recorder) recycle() {
	r.reset()
	recorders.Put(r)
}

// reset empties r for another answer.
func (r *recorder) reset() {
	clear(r.header)
	r.status, r.wroteHeader = http.StatusOK, false
	if r.body.Cap() > DefaultMaxBody {
		r.body = bytes.Buffer{} // do not keep a huge one
	}
	r.body.Reset()
}

// recorder buffers the handler's answer.
type recorder struct {
	header      http.Header
	status      int
	wroteHeader bool
	body        bytes.Buffer
}

func (r *recorder) Header() http.Header { return r.header }
func (r *recorder) WriteHeader(status int) {
	if status >= 100 && status <= 199 && status != http.StatusSwitchingProtocols {
		// Informational (103 Early Hints): not the answer, whose status
		// comes after it. It is not sent either: the answer goes out
		// whole once stored.
		return
	}
	if !r.wroteHeader {
		r.status, r.wroteHeader = status, true
	}
}

// Flush does nothing: the answer is sent whole once stored.
func (*recorder) Flush() {}

func (r *recorder) Write(p []byte) (int, error) {
	r.WriteHeader(http.StatusOK)
	return r.body.Write(p)
}

// Call describes the keyed request a handler runs in. Handlers that store
// the answer themselves, in their own transaction (see the package
// documentation), call MarkCompleted so that Middleware does not store it
// again.
type Call struct {
	ID          string // the record's id
	Lease       string // the lease to complete the record with
	Key         string // the Idempotency-Key as sent (a secret: never log it)
	Scope       Scope  // who asked, and where: the key is scoped to it
	Fingerprint string // the request's fingerprint, as the record holds it
	Recovered   bool   // this request took over a crashed holder's key

	// Packed into a 512-byte size class: the flags next to Recovered, the
	// replay headers by pointer, the store's detached context a view of
	// the Call itself (detachedCall).
	flags         atomic.Uint32 // completed, forgotten
	deferred      *deferral     // Options.Deferred; nil otherwise
	windowID      string
	replayHeaders *[]string // the middleware's, canonical
	// The handler's context (callCtx): the request's, ending at until
	// (ns on the monotonic clock since monoEpoch; 0: when the request's
	// does), through bound once made.
	parent context.Context
	until  int64
	bound  atomic.Pointer[boundCtx]
	body   bodyReader   // the handler's body
	req    http.Request // the handler's request
}

// Response is the Response Middleware would store for an answer with
// this status, header and body: the header cut down to
// Config.ReplayHeaders. A handler that completes the record itself
// (CompleteTx) stores this and writes the same status, header and body,
// so that a replay is byte for byte the first answer.
func (c *Call) Response(status int, header http.Header, body []byte) idemstore.Response {
	resp := idemstore.Response{Status: status, Header: make(http.Header), Body: body}
	for _, h := range *c.replayHeaders {
		if v := header.Values(h); len(v) > 0 {
			resp.Header[http.CanonicalHeaderKey(h)] = v
		}
	}
	return resp
}

// MarkCompleted records that the handler completed the record itself.
func (c *Call) MarkCompleted() { c.flags.Or(completed) }

// A Call's flags.
const (
	completed uint32 = 1 << iota // MarkCompleted
	forgotten                    // Forget
)

func (c *Call) has(flag uint32) bool { return c.flags.Load()&flag != 0 }

// Start returns the record the handler is to create in its own
// transaction (Options.Deferred), or nil when the Guard created it
// already: with nil, a store's StartTx does nothing.
func (c *Call) Start() *idemstore.Start {
	if c.deferred == nil {
		return nil
	}
	return c.deferred.start
}

// deferral is a Deferred call's state (apart, so that a Call stays in its size class).
type deferral struct {
	done    chan struct{}    // closed when the call is finished (local)
	start   *idemstore.Start // the record to create
	created atomic.Bool      // the handler's transaction created it
	refusal error            // what the store refused, for Resume
}

// Created tells a Deferred call that the transaction that created its
// record (Start) committed, or may have: its answer is then stored, or
// the key freed, as without Deferred. Call it also when the commit's
// outcome is unknown; a record that does not exist is freed for nothing.
func (c *Call) Created() {
	if c.deferred != nil {
		c.deferred.created.Store(true)
	}
}

// Refused reports whether err, from creating a Deferred call's record, is
// one the Guard answers itself: the key has a record
// (idemstore.ErrKeyTaken), the window is held (*idemstore.WindowHeldError)
// or the submit token was refused (token.ErrInvalid). The handler then
// rolls its transaction back, writes nothing and returns; Middleware
// answers as without Deferred (Guard.Resume). Other errors, and every
// error of a call that is not Deferred, are the handler's: false.
func (c *Call) Refused(err error) bool {
	d := c.deferred
	if d == nil || err == nil || d.created.Load() {
		return false
	}
	var held *idemstore.WindowHeldError
	if errors.Is(err, idemstore.ErrKeyTaken) || errors.As(err, &held) || errors.Is(err, token.ErrInvalid) {
		d.refusal = err
		return true
	}
	return false
}

// Refusal is the error Refused accepted, or nil: an adapter that
// supports Deferred calls Guard.Resume when it is set.
func (c *Call) Refusal() error {
	if c.deferred == nil {
		return nil
	}
	return c.deferred.refusal
}

// Forget makes the handler's answer transient: it is sent but not stored,
// and the key, its token and its window entry are freed, as after a 5xx.
// For answers that tell the client to come back (a 409 with Retry-After),
// which a stored replay would repeat forever.
func (c *Call) Forget() { c.flags.Or(forgotten) }

type callKey struct{}

// ErrLeaseEnding is the cause (context.Cause) of a handler's context, or
// Do's fn's, that ended because nine tenths of the key's lease had
// passed: after the lease a retry may take the key over and run the
// handler again, so a handler that honours its context stops first, and
// the last tenth is left to store its answer.
var ErrLeaseEnding = errors.New("idempotency: the key's lease is running out")

// callCtx is the handler's context, as a view of the Call (no allocation,
// no field of its own): the request's context with the Call as a value,
// ending when nine tenths of the key's lease have passed unless the
// request's ends first. It is what context.WithValue(
// context.WithDeadlineCause(ctx, until, ErrLeaseEnding), callKey{}, call)
// would be. The deadline's timer is made the first time something waits on
// the context (Done; Err or Value once the deadline has passed), so a
// handler that never waits pays nothing for it.
type callCtx Call

// boundCtx is the request's context with the lease's deadline, and its
// cancel.
type boundCtx struct {
	context.Context
	cancel context.CancelFunc
}

// endedCall marks a Call whose handler is done (Finish, Abort, Resume)
// before its context's deadline was made: the context is then cancelled,
// as net/http's is once a handler returned, made so (ended) only if
// something looks at it again.
var endedCall = new(boundCtx)

// monoEpoch is the origin of Call.until, on the monotonic clock.
var monoEpoch = time.Now()

// bind makes ctx the request's context of c's handler, ending at nine
// tenths of lease from start: when the store was asked for the lease (a
// time.Now taken before the Begin that gave it), not when its answer came
// back, so that a slow Begin does not move the end past the lease's.
func (c *Call) bind(ctx context.Context, lease time.Duration, start time.Time) {
	c.parent = ctx
	until := start.Sub(monoEpoch) + lease - lease/10
	if d, ok := ctx.Deadline(); !ok || monoEpoch.Add(until).Before(d) {
		c.until = max(int64(until), 1)
	}
}

// endCtx ends the handler's context (context.Canceled, unless it ended
// before), stopping its deadline's timer if one was made. What the
// handler left behind sees it ended, as under net/http, and never its
// request's context again (whose Done may already have been closed by it).
func (c *Call) endCtx() {
	for {
		switch b := c.bound.Load(); b {
		case nil:
			if c.bound.CompareAndSwap(nil, endedCall) {
				return
			}
		case endedCall:
			return
		default:
			b.cancel() // b stays: ended, with the request's values
			return
		}
	}
}

// bounded returns the context that ends at the lease's deadline, made on
// first use; the request's while there is no such deadline; an ended one
// once the Call ended.
func (c *callCtx) bounded() context.Context {
	for {
		switch b := c.bound.Load(); b {
		case nil:
			if c.until == 0 {
				return c.parent
			}
			ctx, cancel := context.WithDeadlineCause(c.parent, monoEpoch.Add(time.Duration(c.until)), ErrLeaseEnding)
			if c.bound.CompareAndSwap(nil, &boundCtx{Context: ctx, cancel: cancel}) {
				return ctx
			}
			cancel() // another goroutine made it, or the Call ended: look again
		case endedCall:
			ctx, cancel := context.WithCancel(c.parent)
			cancel()
			if c.bound.CompareAndSwap(endedCall, &boundCtx{Context: ctx, cancel: cancel}) {
				return ctx
			}
		default:
			return b.Context
		}
	}
}

// unbound reports that the request's context stands for c: nothing is
// made, the Call has not ended, and there is no lease deadline or it has
// not passed.
func (c *callCtx) unbound() bool {
	return c.bound.Load() == nil && (c.until == 0 || int64(time.Since(monoEpoch)) < c.until)
}

func (c *callCtx) Deadline() (time.Time, bool) {
	if c.bound.Load() != nil {
		return c.bounded().Deadline()
	}
	if c.until == 0 {
		return c.parent.Deadline()
	}
	return monoEpoch.Add(time.Duration(c.until)), true
}

func (c *callCtx) Done() <-chan struct{} { return c.bounded().Done() }

func (c *callCtx) Err() error {
	if c.unbound() {
		return c.parent.Err()
	}
	return c.bounded().Err()
}

func (c *callCtx) Value(key any) any {
	if _, ok := key.(callKey); ok {
		return (*Call)(c)
	}
	if c.unbound() {
		return c.parent.Value(key)
	}
	return c.bounded().Value(key)
}

// detachedCall is what context.WithoutCancel(ctx) returns for the
// request's context ctx, as a view of the Call (no allocation, no field):
// the request's values, without its deadline or cancellation, so that a
// record is completed or freed even when the client went away.
type detachedCall Call

func (*detachedCall) Deadline() (time.Time, bool) { return time.Time{}, false }
func (*detachedCall) Done() <-chan struct{}       { return nil }
func (*detachedCall) Err() error                  { return nil }
func (d *detachedCall) Value(key any) any         { return d.parent.Value(key) }

// bodyReader is the handler's r.Body: the body Middleware read, with the
// methods of io.NopCloser(bytes.NewReader(body)), kept in the Call. b is
// what is left to read.
type bodyReader struct {
	b []byte
}

func (r *bodyReader) reset(b []byte) { r.b = b }

func (r *bodyReader) Read(p []byte) (int, error) {
	if len(r.b) == 0 {
		return 0, io.EOF
	}
	n := copy(p, r.b)
	r.b = r.b[n:]
	return n, nil
}

func (r *bodyReader) WriteTo(w io.Writer) (int64, error) {
	rest := r.b
	if len(rest) == 0 {
		return 0, nil
	}
	n, err := w.Write(rest)
	if n > len(rest) {
		panic("idempotency: invalid Write count")
	}
	r.b = rest[n:]
	if err == nil && n != len(rest) {
		err = io.ErrShortWrite
	}
	return int64(n), err
}

func (*bodyReader) Close() error { return nil }

// readBody reads r's body, up to limit+1 bytes (more is 413), as
// io.ReadAll(io.LimitReader(r.Body, limit+1)) would, but in one
// allocation of the announced length when there is one (up to 64 KiB: a
// client does not make it allocate more than it sends).
func readBody(r *http.Request, limit int64) ([]byte, error) {
	if r.Body == nil || r.Body == http.NoBody {
		return []byte{}, nil
	}
	limit = min(limit, math.MaxInt64-1)
	size := int64(512)
	if n := r.ContentLength; n >= 0 && n <= limit {
		size = min(n, DefaultMaxBody) + 1 // + 1: room to read EOF without growing
	}
	b := make([]byte, 0, size)
	for {
		if len(b) == cap(b) {
			b = append(b, 0)[:len(b)] // grow
		}
		n, err := r.Body.Read(b[len(b):min(int64(cap(b)), limit+1)])
		b = b[:len(b)+n]
		if err != nil {
			if err == io.EOF {
				err = nil
			}
			return b, err
		}
		if int64(len(b)) > limit {
			return b, nil
		}
	}
}

// FromContext returns the keyed request a handler runs in, if any.
func FromContext(ctx context.Context) (*Call, bool) {
	c, ok := ctx.Value(callKey{}).(*Call)
	return c, ok
}
