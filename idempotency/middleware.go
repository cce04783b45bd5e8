package idempotency

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"slices"
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

// Config configures Middleware. Store is required; every other field has
// a default, written in its comment.
type Config struct {
	// Store keeps the key records. Required.
	Store idemstore.Store

	// Tokens, when set, treats keys starting with "st_" as submit tokens
	// of Purpose and binds each, on first use, atomically with creating its
	// record (the store must keep both, see idemstore.FullStore). Default: nil, keys
	// are only keys.
	Tokens *token.Tokens
	// Purpose is the submit-token purpose of the routes this middleware
	// guards (for example "withdrawal").
	Purpose string
	// RequireToken refuses keys that are not submit tokens (400
	// submit_token_required). Default: false.
	RequireToken bool

	// Windows and Window turn on the repeat-submit window: the same
	// principal sending a request with the same fingerprint to the same
	// route under another key within Window gets 429 duplicate_submission.
	// Default: off. A Window without Windows uses Store, if it is a
	// idemstore.WindowStore (every store here is); else Middleware panics.
	Windows idemstore.WindowStore
	Window  time.Duration

	// Principal returns who is asking; keys are scoped to it. An error
	// that is a *Problem is answered as it is (say, 503 when the session
	// store is down: a caller must not be told to sign in again because a
	// database was busy), any other 401 unauthenticated. Default: everyone
	// is "".
	Principal func(r *http.Request) (string, error)

	// Fingerprint returns the request's fingerprint from its body. An
	// error that is a *Problem is answered as it is, any other 400
	// invalid_json. Default: Fingerprint(body) (canonical JSON).
	Fingerprint func(r *http.Request, body []byte) (string, error)

	// Lease protects an in-flight request: a retry within it gets 409; after
	// it (the holder crashed) a retry runs again. Keep it longer than the
	// handler's timeout. Default: DefaultLease, 30s.
	Lease time.Duration
	// TTL is how long a key's record is kept. Default: DefaultTTL, 24h.
	TTL time.Duration
	// MaxBody is the largest body accepted (413 body_too_large above).
	// Default: DefaultMaxBody, 64 KiB.
	MaxBody int64
	// ReplayHeaders are the response headers stored and replayed; no
	// others are (never Set-Cookie). Default: Content-Type,
	// Content-Language, Location.
	ReplayHeaders []string

	// Now is the clock. Default: time.Now.
	Now func() time.Time
	// WriteProblem writes an error answer. Default: WriteProblem.
	WriteProblem func(w http.ResponseWriter, r *http.Request, p *Problem)
	// OnEvent, if set, is told each request's outcome: "new", "recovered",
	// "replayed", "in_progress", "mismatch", "key_missing", "key_invalid",
	// "token_invalid", "token_foreign" (another principal's token: the
	// same 400 as invalid), "token_required", "duplicate_submission",
	// "released" (the key was freed after the handler ran: a 5xx, a panic,
	// Call.Forget, an answer that could not be stored, or none at all from
	// a handler that returned without writing once the request's context
	// had ended, which is answered 503 request_interrupted; a token bound
	// with it can be used again), "store_unavailable", "interrupted" (the
	// client went away while the store worked, before the handler ran:
	// 503 request_interrupted, nothing kept). Low cardinality: fit for a
	// metric label.
	OnEvent func(r *http.Request, event string)
}

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
func Middleware(cfg Config) func(http.Handler) http.Handler {
	if cfg.Store == nil {
		panic("idempotency: Middleware needs a Store")
	}
	if cfg.Window > 0 && cfg.Windows == nil {
		ws, ok := cfg.Store.(idemstore.WindowStore)
		if !ok {
			panic("idempotency: Config.Window needs Windows, a WindowStore (Store is not one)")
		}
		cfg.Windows = ws
	}
	if cfg.Lease <= 0 {
		cfg.Lease = DefaultLease
	}
	if cfg.TTL <= 0 {
		cfg.TTL = DefaultTTL
	}
	if cfg.MaxBody <= 0 {
		cfg.MaxBody = DefaultMaxBody
	}
	if cfg.ReplayHeaders == nil {
		cfg.ReplayHeaders = []string{"Content-Type", "Content-Language", "Location"}
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.WriteProblem == nil {
		cfg.WriteProblem = func(w http.ResponseWriter, _ *http.Request, p *Problem) { WriteProblem(w, p) }
	}
	if cfg.Fingerprint == nil {
		cfg.Fingerprint = func(_ *http.Request, body []byte) (string, error) { return Fingerprint(body) }
	}
	replay := make([]string, len(cfg.ReplayHeaders))
	for i, h := range cfg.ReplayHeaders {
		replay[i] = http.CanonicalHeaderKey(h)
	}
	return func(next http.Handler) http.Handler {
		return &middleware{cfg: cfg, next: next, replayHeaders: replay}
	}
}

type middleware struct {
	cfg           Config
	next          http.Handler
	replayHeaders []string // cfg.ReplayHeaders, canonical
}

func (m *middleware) event(r *http.Request, ev string) {
	if m.cfg.OnEvent != nil {
		m.cfg.OnEvent(r, ev)
	}
}

func (m *middleware) fail(w http.ResponseWriter, r *http.Request, ev string, p *Problem) {
	if ev != "" {
		m.event(r, ev)
	}
	m.cfg.WriteProblem(w, r, p)
}

func (m *middleware) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	cfg := &m.cfg
	ctx := r.Context()

	// 1. Body size, then who is asking.
	body, err := readBody(r, cfg.MaxBody)
	if err != nil {
		m.fail(w, r, "", &Problem{Status: http.StatusBadRequest, Code: "invalid_request", Title: "Unreadable body", Detail: "the request body could not be read"})
		return
	}
	if int64(len(body)) > cfg.MaxBody {
		p := *probTooLarge
		p.Detail = fmt.Sprintf("the body is over %d bytes", cfg.MaxBody)
		m.fail(w, r, "", &p)
		return
	}
	principal := ""
	if cfg.Principal != nil {
		var err error
		if principal, err = cfg.Principal(r); err != nil {
			p := probAuth
			errors.As(err, &p)
			m.fail(w, r, "", p)
			return
		}
	}

	// 2. The key's syntax.
	key, err := ParseKey(r.Header["Idempotency-Key"]) // canonical: as Values would look it up
	if errors.Is(err, ErrKeyMissing) {
		m.fail(w, r, "key_missing", probMissing)
		return
	} else if err != nil {
		m.fail(w, r, "key_invalid", probInvalid)
		return
	}

	// 3. The body.
	fp, err := cfg.Fingerprint(r, body)
	if err != nil {
		var p *Problem
		if !errors.As(err, &p) {
			p = &Problem{Status: probJSON.Status, Code: probJSON.Code, Title: probJSON.Title, Detail: err.Error()}
		}
		m.fail(w, r, "", p)
		return
	}

	// 4. A submit token. The store checks and binds it in Begin, before it
	// looks at the key's record, so its refusals still come before step
	// 5's answers, and without a round trip of their own: a record for this
	// key exists only if the token was bound to this very request.
	scope := Scope{Principal: principal, Method: r.Method, Path: r.URL.Path}
	var claim *idemstore.TokenClaim
	switch {
	case cfg.Tokens != nil && token.IsToken(key):
		claim = &idemstore.TokenClaim{Hash: token.Hash(key), Subject: principal, Purpose: cfg.Purpose, Scope: scope.String()}
	case cfg.RequireToken:
		m.fail(w, r, "token_required", probTokenRequired)
		return
	}

	// 5. The key's record.
	id := RecordID(scope, key)
	now := cfg.Now()
	res, err := cfg.Store.Begin(ctx, idemstore.BeginRequest{ID: id, Fingerprint: fp, Lease: cfg.Lease, TTL: cfg.TTL, Token: claim, Now: now})
	if err != nil {
		m.tokenError(w, r, err)
		return
	}
	switch res.Outcome {
	case idemstore.Replay:
		m.event(r, "replayed")
		replay(w, res.Record.Response)
		return
	case idemstore.InProgress:
		m.fail(w, r, "in_progress", probInProgress)
		return
	case idemstore.Mismatch:
		m.fail(w, r, "mismatch", probReused)
		return
	}
	// One allocation carries the call, the handler's context and body.
	call := &Call{ID: id, Lease: res.Lease, Key: key, Scope: scope, Fingerprint: fp, Recovered: res.Recovered, replayHeaders: &m.replayHeaders}
	call.ctx = callCtx{Context: ctx, call: call}
	// From here the key is ours: every way out completes or frees it.
	detached := (*detachedCall)(call)

	// 6. The repeat-submit window.
	var windowID string
	if cfg.Windows != nil && cfg.Window > 0 {
		windowID = digest(principal, r.Method, r.URL.Path, fp)
		// Owned by this attempt at the key's record: a retry of the same
		// key (after a crashed holder) is not a duplicate of itself, and a
		// stale attempt frees only its own claim.
		left, err := cfg.Windows.ClaimWindow(ctx, windowID, idemstore.WindowOwner(id, res.Lease), cfg.Window, now)
		if err != nil || left > 0 {
			_ = cfg.Store.Abandon(detached, id, res.Lease) // not recorded: key and token stay usable
			if err != nil {
				m.storeFailed(w, r, err)
				return
			}
			m.fail(w, r, "duplicate_submission", &Problem{
				Status: http.StatusTooManyRequests, Code: "duplicate_submission", Title: "Duplicate submission",
				Detail:     "the same request was accepted moments ago under another key; wait before sending it again",
				RetryAfter: int(math.Ceil(min(left, cfg.Window).Seconds())), // whole seconds left, never more than the window
			})
			return
		}
	}
	call.windowID = windowID
	if res.Recovered {
		m.event(r, "recovered")
	} else {
		m.event(r, "new")
	}

	// 7. The handler, with its answer buffered so that what is stored is
	// exactly what is sent.
	rec := recorders.Get().(*recorder)
	defer rec.recycle()
	if m.serve(rec, r, body, call) || call.forgotten.Load() {
		m.release(r, detached, id, res.Lease, windowID)
	} else if !rec.wroteHeader && !call.completed.Load() && ctx.Err() != nil {
		// No answer: the handler gave up when the request's context ended
		// (a deadline, a client gone). Its empty 200 is not an outcome to
		// replay for the key's whole TTL: freed, as after a 5xx.
		m.release(r, detached, id, res.Lease, windowID)
		m.fail(w, r, "", probInterrupted)
		return
	} else if !call.completed.Load() {
		// The stored header is the recorder's too: a Store copies what it
		// keeps (as it does the body, which is the recorder's buffer).
		resp := idemstore.Response{Status: rec.status, Header: m.storedHeader(rec), Body: rec.body.Bytes()}
		// A success happened: send it even if storing it fails; the
		// business tables' unique constraints refuse a second effect and
		// pin its outcome. A refusal (4xx) pins nothing: sent unstored,
		// the key could run again after its lease and answer differently.
		// Free the key and say 503 instead: the client retries.
		if err := cfg.Store.Complete(detached, id, res.Lease, resp, cfg.Now()); err != nil && (rec.status < 200 || rec.status > 299) {
			m.release(r, detached, id, res.Lease, windowID)
			m.fail(w, r, "store_unavailable", probUnavailable)
			return
		}
	}
	wh := w.Header()
	for k, v := range rec.header {
		wh[k] = v
	}
	if _, ok := rec.header["Cache-Control"]; !ok {
		wh["Cache-Control"] = []string{"no-store"}
	}
	w.WriteHeader(rec.status)
	_, _ = w.Write(rec.body.Bytes())
}

// storedHeader returns the handler's header cut down to the replay
// headers: the handler's own when it has nothing else (the usual case, a
// Content-Type), else the recorder's stored header, filled.
func (m *middleware) storedHeader(rec *recorder) http.Header {
	all := true
	for k, v := range rec.header {
		if len(v) == 0 || !slices.Contains(m.replayHeaders, k) {
			all = false
			break
		}
	}
	if all {
		return rec.header
	}
	for _, h := range m.replayHeaders {
		if v := rec.header[h]; len(v) > 0 {
			rec.stored[h] = v
		}
	}
	return rec.stored
}

// serve runs the handler and reports whether the key must be freed: a 5xx,
// or a panic (freed, then re-raised).
func (m *middleware) serve(rec *recorder, r *http.Request, body []byte, call *Call) (free bool) {
	defer func() {
		if v := recover(); v != nil {
			m.release(r, context.WithoutCancel(r.Context()), call.ID, call.Lease, call.windowID)
			panic(v)
		}
	}()
	call.body.reset(body)
	r.Body = &call.body
	// r.WithContext's copy, made in the Call: no allocation of its own.
	call.req = *r.WithContext(&call.ctx)
	m.next.ServeHTTP(rec, &call.req)
	return rec.status >= 500
}

// release frees a key whose request must be allowed to run again.
func (m *middleware) release(r *http.Request, ctx context.Context, id, lease, windowID string) {
	_ = m.cfg.Store.Abandon(ctx, id, lease)
	if windowID != "" {
		_ = m.cfg.Windows.FreeWindow(ctx, windowID, idemstore.WindowOwner(id, lease))
	}
	m.event(r, "released")
}

func (m *middleware) tokenError(w http.ResponseWriter, r *http.Request, err error) {
	if errors.Is(err, token.ErrForeign) {
		m.fail(w, r, "token_foreign", probTokenInvalid) // the same answer: no hint that the token exists
		return
	}
	if errors.Is(err, token.ErrInvalid) {
		m.fail(w, r, "token_invalid", probTokenInvalid)
		return
	}
	m.storeFailed(w, r, err)
}

// storeFailed answers a store error before the handler ran: 503
// store_unavailable, or 503 request_interrupted ("interrupted") when the
// request's context was cancelled (the client went away) and the store
// gave up with it. That store did not fail: it must not show as an
// unreachable store in the metrics and alerts.
func (m *middleware) storeFailed(w http.ResponseWriter, r *http.Request, err error) {
	if errors.Is(err, context.Canceled) && r.Context().Err() != nil {
		m.fail(w, r, "interrupted", probInterrupted)
		return
	}
	m.fail(w, r, "store_unavailable", probUnavailable)
}

// replay writes a stored answer. The stored header is the store's and
// read-only: its values are copied, so that whatever wraps w may change
// what it gets; one allocation holds them and the two headers added.
func replay(w http.ResponseWriter, resp *idemstore.Response) {
	n := 2
	for _, v := range resp.Header {
		n += len(v)
	}
	vals := make([]string, 0, n)
	h := w.Header()
	for k, v := range resp.Header {
		i := len(vals)
		vals = append(vals, v...)
		h[k] = vals[i:len(vals):len(vals)]
	}
	vals = append(vals, "true", "no-store")
	h["Idempotent-Replayed"] = vals[n-2 : n-1 : n-1]
	h["Cache-Control"] = vals[n-1 : n : n]
	w.WriteHeader(resp.Status)
	_, _ = w.Write(resp.Body)
}

// recorders recycles answer buffers: a request's recorder is returned
// after its answer was stored (copied) and written out.
var recorders = sync.Pool{New: func() any {
	return &recorder{header: make(http.Header), stored: make(http.Header), status: http.StatusOK}
}}

func (r *recorder) recycle() {
	clear(r.header)
	if len(r.stored) > 0 {
		clear(r.stored)
	}
	r.status, r.wroteHeader = http.StatusOK, false
	if r.body.Cap() > DefaultMaxBody {
		r.body = bytes.Buffer{} // do not keep a huge one
	}
	r.body.Reset()
	recorders.Put(r)
}

// recorder buffers the handler's answer.
type recorder struct {
	header      http.Header
	stored      http.Header // the Response's header, cut to the replay headers
	status      int
	wroteHeader bool
	body        bytes.Buffer
}

func (r *recorder) Header() http.Header { return r.header }
func (r *recorder) WriteHeader(status int) {
	if !r.wroteHeader {
		r.status, r.wroteHeader = status, true
	}
}
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
	completed     atomic.Bool
	forgotten     atomic.Bool
	windowID      string
	replayHeaders *[]string    // the middleware's, canonical
	ctx           callCtx      // the handler's context
	body          bodyReader   // the handler's body
	req           http.Request // the handler's request
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
func (c *Call) MarkCompleted() { c.completed.Store(true) }

// Forget makes the handler's answer transient: it is sent but not stored,
// and the key, its token and its window entry are freed, as after a 5xx.
// For answers that tell the client to come back (a 409 with Retry-After),
// which a stored replay would repeat forever.
func (c *Call) Forget() { c.forgotten.Store(true) }

type callKey struct{}

// callCtx is the handler's context: the request's, with its Call. It is
// what context.WithValue(ctx, callKey{}, call) would be, kept in the Call
// so that it costs no allocation of its own.
type callCtx struct {
	context.Context
	call *Call
}

func (c *callCtx) Value(key any) any {
	if _, ok := key.(callKey); ok {
		return c.call
	}
	return c.Context.Value(key)
}

// detachedCall is what context.WithoutCancel(ctx) returns for the
// request's context ctx, as a view of the Call (no allocation, no field):
// the request's values, without its deadline or cancellation, so that a
// record is completed or freed even when the client went away.
type detachedCall Call

func (*detachedCall) Deadline() (time.Time, bool) { return time.Time{}, false }
func (*detachedCall) Done() <-chan struct{}       { return nil }
func (*detachedCall) Err() error                  { return nil }
func (d *detachedCall) Value(key any) any         { return d.ctx.Context.Value(key) }

// bodyReader is the handler's r.Body: the body Middleware read, with the
// methods of io.NopCloser(bytes.NewReader(body)), kept in the Call.
type bodyReader struct {
	b []byte
	i int
}

func (r *bodyReader) reset(b []byte) { r.b, r.i = b, 0 }

func (r *bodyReader) Read(p []byte) (int, error) {
	if r.i >= len(r.b) {
		return 0, io.EOF
	}
	n := copy(p, r.b[r.i:])
	r.i += n
	return n, nil
}

func (r *bodyReader) WriteTo(w io.Writer) (int64, error) {
	rest := r.b[r.i:]
	if len(rest) == 0 {
		return 0, nil
	}
	n, err := w.Write(rest)
	if n > len(rest) {
		panic("idempotency: invalid Write count")
	}
	r.i += n
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
