package idempotency

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"mime"
	"net/http"
	"net/url"
	"slices"
	"sync"
	"time"

	"github.com/onceguard/onceguard/idempotency/idemstore"
	"github.com/onceguard/onceguard/token"
)

// Options configure a Guard, the transport-neutral core of the
// middleware. R is the transport's request type (*http.Request for
// Middleware, a framework's context for its adapter): the hooks get it
// back. Store is required; every other field has a default, written in
// its comment. Config is Options for net/http.
type Options[R any] struct {
	// Store keeps the key records. Required.
	Store idemstore.Store

	// Tokens, when set, treats keys starting with "st_" as submit tokens
	// of Purpose and binds each, on first use, atomically with creating its
	// record (the store must keep both, see idemstore.FullStore). Signed
	// tokens (token.Options.Key) are verified here, before the store, and
	// bound by the record alone (idemstore.SignedTokenStore). Default: nil,
	// keys are only keys.
	Tokens *token.Tokens
	// Purpose is the submit-token purpose of the routes this middleware
	// guards (for example "withdrawal").
	Purpose string
	// RequireToken refuses keys that are not submit tokens (400
	// submit_token_required). Default: false.
	RequireToken bool
	// OfferToken hands the client its next submit token with the answer,
	// so that a form or client submitting again needs no request to mint
	// one: the answer of a request whose key is a submit token, or on a
	// RequireToken route, gets a fresh token of Purpose for the same
	// principal in Next-Submit-Token, with its expiry (RFC 3339) in
	// Next-Submit-Token-Expires. On every answer but a replay (the stored
	// answer as it was), a 5xx (the key and its token stay the request's,
	// for its retry) and a 401, and only once the principal is known. It
	// is added after the answer is stored, never stored with it. It needs
	// signed Tokens (token.Options.Key), whose minting writes nothing: an
	// offer left unused expires unseen. Told as the event
	// "token_offered". Default: false.
	OfferToken bool

	// Windows and Window turn on the repeat-submit window: the same
	// principal sending a request with the same fingerprint to the same
	// route under another key within Window gets 429 duplicate_submission.
	// Default: off. A Window without Windows uses Store, if it is a
	// idemstore.WindowStore (every store here is); else the constructor
	// panics.
	Windows idemstore.WindowStore
	Window  time.Duration

	// Principal returns who is asking; keys are scoped to it. An error
	// that is a *Problem is answered as it is (say, 503 when the session
	// store is down: a caller must not be told to sign in again because a
	// database was busy), any other 401 unauthenticated. Default: everyone
	// is "".
	Principal func(r R) (string, error)

	// Fingerprint returns the request's fingerprint from its body. An
	// error that is a *Problem is answered as it is, any other 400
	// invalid_json. Default: Fingerprint(body) (canonical JSON).
	Fingerprint func(r R, body []byte) (string, error)

	// KeyField, when set, names a field of the body that carries the key
	// when the request has no Idempotency-Key header (the header wins when
	// both are there): a field of an application/x-www-form-urlencoded
	// body, or a top-level string member of a JSON object (any other
	// Content-Type). Its syntax is the header's. Default: "", the header
	// only.
	KeyField string
	// KeyOptional runs a request without a key once, unprotected, instead
	// of answering 400 idempotency_key_missing; it is counted as the event
	// "unprotected". A key that is present is checked as always; one that
	// is present but empty (an empty header or field) is invalid, not
	// absent. Default: false.
	KeyOptional bool

	// Lease protects an in-flight request: a retry within it gets 409; after
	// it (the holder crashed) a retry runs again. The handler's context
	// ends when nine tenths of it have passed (context.Cause:
	// ErrLeaseEnding), unless the request's own deadline comes first, so a
	// handler that honours its context stops before a retry may take the
	// key over; one that then writes nothing frees the key (503
	// request_interrupted), as does a 5xx. Keep it longer than the
	// handler's timeout. Default: DefaultLease, 30s.
	Lease time.Duration
	// Wait, when positive, makes a retry that arrives while the key's
	// first request is in flight wait up to Wait for its answer (and then
	// replay it) instead of answering 409 at once. The store wakes it
	// where it can (idemstore.Notifier: memstore, redisstore, sqlstore on
	// PostgreSQL with a Listener), asking it again once a second besides;
	// else it polls, every 10 ms at first, backing off to 200 ms. Default:
	// 0, no wait.
	Wait time.Duration
	// TTL is how long a key's record is kept. Default: DefaultTTL, 24h.
	TTL time.Duration
	// MaxBody is the largest body accepted (413 body_too_large above).
	// Default: DefaultMaxBody, 64 KiB.
	MaxBody int64
	// ReplayHeaders are the response headers stored and replayed; no
	// others are (never Set-Cookie). The single entry "*" stores every
	// header but Set-Cookie, Date, Content-Length and the hop-by-hop ones
	// (a gateway in front of a service it does not know). Default:
	// Content-Type, Content-Language, Location.
	ReplayHeaders []string
	// StoreServerErrors stores and replays a 5xx answer as any other,
	// instead of freeing the key: for a handler that cannot know whether
	// the effect happened before the failure (a gateway in front of
	// another service). An answer that could not be stored then never
	// frees the key either (it is sent, the key left to its lease). Call.Forget
	// still frees the key. Default: false.
	StoreServerErrors bool
	// MarkFirst sends Idempotent-Replayed: false on first answers, so a
	// client can tell them from replays without relying on the header's
	// absence. Default: false.
	MarkFirst bool
	// ExpiryHeader sends Idempotency-Key-Expires (an HTTP date) on first
	// answers and on replays: until then a retry with the key gets this
	// answer, after it the key may run again. A replay from a store that
	// does not report expiry has none. Default: false.
	ExpiryHeader bool

	// Deferred creates no record in Begin for a key: the handler creates
	// it in the transaction that makes its effect, from Call.Start (with
	// sqlstore.Store.StartTx, or in one statement with StartCTE), and
	// calls Call.Created once that transaction committed. A crash or a
	// rollback then leaves neither the record nor the effect, and a first
	// request costs no commit of its own ("atomic phases"). When the
	// store reports the key taken, the token refused or the window held,
	// the handler rolls back, writes nothing and returns
	// (Call.Refused); the Guard then answers as it would have before the
	// handler ran (Guard.Resume): a replay, 409, 422, 429, 400, or it runs
	// the handler again with the record created as without Deferred. An
	// answer written without Call.Created is sent as it is and kept
	// nowhere (the event "unrecorded"). Middleware (net/http) supports it;
	// an adapter must call Resume and run its handler again. Default:
	// false.
	Deferred bool

	// Now is the clock. Default: time.Now.
	Now func() time.Time
	// OnEvent, if set, is told each request's outcome: "new", "recovered",
	// "replayed", "in_progress", "mismatch", "key_missing", "key_invalid",
	// "token_invalid", "token_foreign" (another principal's token: the
	// same 400 as invalid), "token_required", "duplicate_submission",
	// "unprotected" (no key on a KeyOptional route), "waited" (a retry
	// that waited for the first answer, then replayed it; "replayed" is
	// told too), "released" (the key was freed after the handler ran: a
	// 5xx, a panic, Call.Forget, an answer that could not be stored, or
	// none at all from a handler that returned without writing once the
	// request's context had ended, which is answered 503
	// request_interrupted; a token bound with it can be used again),
	// "store_unavailable", "interrupted" (the client went away while the
	// store worked, before the handler ran: 503 request_interrupted,
	// nothing kept), "unrecorded" (Deferred: the handler answered without
	// creating the record; nothing kept), and besides the outcome
	// "token_offered" (OfferToken: the answer carries the next token).
	// With Deferred, "new" is told when the handler reports the record
	// created. Low cardinality: fit for a metric label.
	OnEvent func(r R, event string)
}

// Guard runs the duplicate protection on a small request/answer
// abstraction, for any transport: Begin runs the checks before the
// handler, in the order of docs/api.md (body size and principal, key
// syntax, body, submit token, the key's record, the repeat-submit
// window); the transport runs its handler with its answer buffered; Finish
// stores the answer (or frees the key). Middleware is its net/http
// adapter; adapters for other frameworks are built the same way. A Guard
// is safe for concurrent use.
type Guard[R any] struct {
	o             Options[R]
	local         local    // Deferred: this Guard's keys in flight
	replayHeaders []string // o.ReplayHeaders, canonical; nil for "*"
	allHeaders    bool     // "*"
}

// NewGuard returns the Guard of o. It panics without a Store, or with a
// Window and no WindowStore, as Middleware does.
func NewGuard[R any](o Options[R]) *Guard[R] {
	if o.Store == nil {
		panic("idempotency: a Guard needs a Store")
	}
	if o.OfferToken && (o.Tokens == nil || !o.Tokens.Signed()) {
		panic("idempotency: OfferToken needs signed Tokens (token.Options.Key), whose minting writes nothing")
	}
	if o.Tokens != nil && o.Tokens.Signed() {
		if _, ok := o.Store.(idemstore.SignedTokenStore); !ok {
			panic("idempotency: signed submit tokens need a Store that binds them (idemstore.SignedTokenStore)")
		}
	}
	if o.Window > 0 && o.Windows == nil {
		ws, ok := o.Store.(idemstore.WindowStore)
		if !ok {
			panic("idempotency: Window needs Windows, a WindowStore (Store is not one)")
		}
		o.Windows = ws
	}
	if o.Lease <= 0 {
		o.Lease = DefaultLease
	}
	if o.TTL <= 0 {
		o.TTL = DefaultTTL
	}
	if o.MaxBody <= 0 {
		o.MaxBody = DefaultMaxBody
	}
	if o.ReplayHeaders == nil {
		o.ReplayHeaders = []string{"Content-Type", "Content-Language", "Location"}
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	g := &Guard[R]{o: o}
	if len(o.ReplayHeaders) == 1 && o.ReplayHeaders[0] == "*" {
		g.allHeaders = true
	} else {
		g.replayHeaders = make([]string, len(o.ReplayHeaders))
		for i, h := range o.ReplayHeaders {
			g.replayHeaders[i] = http.CanonicalHeaderKey(h)
		}
	}
	return g
}

// MaxBody returns the largest body Begin accepts: a transport reads at
// most one byte more (ReadBody), so that Begin can tell it is too large.
func (g *Guard[R]) MaxBody() int64 { return g.o.MaxBody }

// Request is a request as a Guard sees it.
type Request struct {
	Method      string   // the request's method: part of the key's scope
	Path        string   // the concrete path, with its parameters: part of the scope
	Key         []string // the values of the Idempotency-Key header, as sent
	ContentType string   // the Content-Type header: for Options.KeyField
	Body        []byte   // the whole body, up to MaxBody()+1 bytes
}

// Outcome is what Begin decided; exactly one of its fields is set, or
// none. Problem: answer it (WriteProblem). Replay: answer this stored
// answer (ReplayHeader gives its header). Call: run the handler with the
// Call in its context (Call.Context), then Finish. None: the key was
// optional and absent: run the handler, unprotected, and do not Finish.
type Outcome struct {
	Problem *Problem
	Replay  *idemstore.Response
	Call    *Call
	// Expires is when the key's record expires, for
	// Options.ExpiryHeader: zero when unknown or not asked for.
	Expires time.Time
}

// Begin runs the checks before the handler for the request r, described
// by req, whose context is ctx. An answer before the record is created
// uses up no key and no token. A Call returned must be given to Finish
// (or, if the handler panicked, Abort) exactly once.
func (g *Guard[R]) Begin(ctx context.Context, r R, req *Request) Outcome {
	return g.begin(ctx, r, req, g.o.Deferred)
}

// Resume answers a Deferred call whose handler reported a refusal
// (Call.Refused): as Begin would have without Deferred (a replay, 409,
// 422, 429, a token's 400, 503), or with a new Call, its record created,
// to run the handler with again and Finish. Middleware calls it; an
// adapter that supports Deferred does too.
func (g *Guard[R]) Resume(ctx context.Context, r R, req *Request, call *Call) Outcome {
	call.endCtx()
	g.local.finish(call)
	err := call.Refusal()
	var held *idemstore.WindowHeldError
	var out Outcome
	switch {
	case errors.As(err, &held):
		out = g.fail(r, "duplicate_submission", g.duplicate(held.Left))
	case errors.Is(err, idemstore.ErrKeyTaken):
		return g.begin(ctx, r, req, false)
	default:
		out = g.tokenError(ctx, r, err)
	}
	if g.o.OfferToken {
		out.Problem = g.offerProblem(ctx, r, out.Problem, call.Scope.Principal, call.Key)
	}
	return out
}

// duplicate is the 429 of the repeat-submit window, left to wait.
func (g *Guard[R]) duplicate(left time.Duration) *Problem {
	return &Problem{
		Status: http.StatusTooManyRequests, Code: "duplicate_submission", Title: "Duplicate submission",
		Detail:     "the same request was accepted moments ago under another key; wait before sending it again",
		RetryAfter: int(math.Ceil(min(left, g.o.Window).Seconds())), // whole seconds left, never more than the window
	}
}

func (g *Guard[R]) begin(ctx context.Context, r R, req *Request, deferred bool) (out Outcome) {
	o := &g.o

	// 1. Body size, then who is asking.
	if int64(len(req.Body)) > o.MaxBody {
		p := *probTooLarge
		p.Detail = fmt.Sprintf("the body is over %d bytes", o.MaxBody)
		return Outcome{Problem: &p}
	}
	principal := ""
	if o.Principal != nil {
		var err error
		if principal, err = o.Principal(r); err != nil {
			p := probAuth
			errors.As(err, &p)
			return Outcome{Problem: p}
		}
	}
	var key string
	if o.OfferToken { // a problem from here on may carry the next token
		defer func() { out.Problem = g.offerProblem(ctx, r, out.Problem, principal, key) }()
	}

	// 2. The key's syntax.
	keys := req.Key
	if len(keys) == 0 && o.KeyField != "" {
		// The header wins when both are there, as the gateway's contract
		// (docs/gateway.md) says; the repeat-submit window, whose
		// fingerprint leaves the field out, still sees the same form
		// sent under a second key.
		keys = keyField(req.ContentType, req.Body, o.KeyField)
	}
	var err error
	key, err = ParseKey(keys)
	if errors.Is(err, ErrKeyMissing) {
		if o.KeyOptional && len(keys) == 0 {
			g.event(r, "unprotected")
			return Outcome{}
		}
		if o.KeyOptional { // sent, but empty: not run unprotected
			return g.fail(r, "key_invalid", probInvalid)
		}
		return g.fail(r, "key_missing", probMissing)
	} else if err != nil {
		return g.fail(r, "key_invalid", probInvalid)
	}

	// 3. The body.
	var fp string
	if o.Fingerprint != nil {
		fp, err = o.Fingerprint(r, req.Body)
	} else {
		fp, err = Fingerprint(req.Body)
	}
	if err != nil {
		var p *Problem
		if !errors.As(err, &p) {
			p = &Problem{Status: probJSON.Status, Code: probJSON.Code, Title: probJSON.Title, Detail: err.Error()}
		}
		return Outcome{Problem: p}
	}

	// 4. A submit token. The store checks and binds it in Begin, before it
	// looks at the key's record, so its refusals still come before step
	// 5's answers, and without a round trip of their own: a record for this
	// key exists only if the token was bound to this very request.
	scope := Scope{Principal: principal, Method: req.Method, Path: req.Path}
	var claim *idemstore.TokenClaim
	switch {
	case o.Tokens != nil && token.IsToken(key):
		claim = &idemstore.TokenClaim{Hash: token.Hash(key), Subject: principal, Purpose: o.Purpose, Scope: scope.String()}
		if o.Tokens.Signed() { // its signature says all but whether it was used: no round trip
			claim.Signed = true
			switch err := o.Tokens.Verify(key, principal, o.Purpose); {
			case errors.Is(err, token.ErrExpired):
				// A retry of the request it keys is answered as any key's
				// is, with no expiry but the key's: the store looks.
				claim.Expired, deferred = true, false
			case err != nil:
				return g.tokenError(ctx, r, err)
			}
		}
	case o.RequireToken:
		return g.fail(r, "token_required", probTokenRequired)
	}

	// 5. The key's record.
	id := RecordID(scope, key)
	now, begun := o.Now(), time.Now() // begun: when the lease starts, on the monotonic clock
	held := time.Duration(-1)         // the 429's wait when a key here holds the body's window
	if deferred {
		// A key in flight here is turned away before its handler runs
		// (a double click, a client's storm), and one finished moments
		// ago is looked up in the store: neither takes the handler's
		// lock and transaction to learn that the key is taken.
		switch done, state := g.local.claim(id); state {
		case keyNew:
			out := g.deferred(ctx, req, id, key, scope, fp, claim, now, begun)
			out.Call.deferred.done = done
			st := out.Call.deferred.start
			left, ok := time.Duration(0), true
			if st.WindowID != "" {
				left, ok = g.local.holdWindow(st.WindowID, id, st.Lease, now, st.WindowUntil)
			}
			if ok {
				return out
			}
			// Another key here holds the body's window. The key may still
			// have a record of its own (a retry of an older key; a used
			// token): the store's answer comes first, as without Deferred,
			// and only a key it does not know is turned away 429.
			g.local.finish(out.Call) // nothing created: the key is free again
			held = left
		case keyInFlight:
			if o.Wait <= 0 {
				return g.fail(r, "in_progress", probInProgress)
			}
			t := time.NewTimer(o.Wait)
			select { // then the store has its answer, or says in progress
			case <-done:
			case <-t.C:
			case <-ctx.Done():
			}
			t.Stop()
			// The lease Begin gives runs from now, not from before the wait.
			now, begun = o.Now(), time.Now()
		}
	}
	breq := idemstore.BeginRequest{ID: id, Fingerprint: fp, Lease: o.Lease, TTL: o.TTL, Token: claim, Now: now}
	res, err := o.Store.Begin(ctx, breq)
	if err == nil && res.Outcome == idemstore.InProgress && o.Wait > 0 {
		res, err = g.wait(ctx, r, &breq, &begun)
		now = breq.Now // the Begin that answered last: its lease, expiry and window
	}
	if err != nil {
		return g.tokenError(ctx, r, err)
	}
	switch res.Outcome {
	case idemstore.Replay:
		g.event(r, "replayed")
		out := Outcome{Replay: res.Record.Response}
		if o.ExpiryHeader {
			out.Expires = res.Record.ExpiresAt
		}
		return out
	case idemstore.InProgress:
		return g.fail(r, "in_progress", probInProgress)
	case idemstore.Mismatch:
		return g.fail(r, "mismatch", probReused)
	}
	if held >= 0 && !res.Recovered { // new to the store: a duplicate of the key in flight or created here
		_ = o.Store.Abandon(context.WithoutCancel(ctx), id, res.Lease) // not recorded: key and token stay usable
		return g.fail(r, "duplicate_submission", g.duplicate(held))
	}
	// One allocation carries the call, the handler's context and body.
	call := &Call{ID: id, Lease: res.Lease, Key: key, Scope: scope, Fingerprint: fp, Recovered: res.Recovered, replayHeaders: &g.replayHeaders}
	call.bind(ctx, o.Lease, begun)
	// From here the key is ours: every way out completes or frees it.
	detached := (*detachedCall)(call)

	// 6. The repeat-submit window.
	var windowID string
	if o.Windows != nil && o.Window > 0 {
		windowID = digest(principal, req.Method, req.Path, fp)
		// Owned by this attempt at the key's record: a retry of the same
		// key (after a crashed holder) is not a duplicate of itself, and a
		// stale attempt frees only its own claim.
		left, err := o.Windows.ClaimWindow(ctx, windowID, idemstore.WindowOwner(id, res.Lease), o.Window, now)
		if (err != nil || left > 0) && res.Recovered && o.StoreServerErrors {
			// Its crashed holder passed the window and may have made the
			// effect, which its handler cannot know: freed, the key would
			// run as new. The handler gets it, to say so.
			windowID, err, left = "", nil, 0
		}
		if err != nil || left > 0 {
			_ = o.Store.Abandon(detached, id, res.Lease) // not recorded: key and token stay usable
			if err != nil {
				return g.storeFailed(ctx, r, err)
			}
			return g.fail(r, "duplicate_submission", g.duplicate(left))
		}
	}
	call.windowID = windowID
	if res.Recovered {
		g.event(r, "recovered")
	} else {
		g.event(r, "new")
	}
	out = Outcome{Call: call}
	if o.ExpiryHeader {
		out.Expires = now.Add(o.TTL)
	}
	return out
}

// deferred is Begin's Call for Options.Deferred: the record, its token
// and its window entry are the handler's to create (Call.Start).
func (g *Guard[R]) deferred(ctx context.Context, req *Request, id, key string, scope Scope, fp string, claim *idemstore.TokenClaim, now, begun time.Time) Outcome {
	o := &g.o
	lease := newLease()
	call := &Call{ID: id, Lease: lease, Key: key, Scope: scope, Fingerprint: fp, replayHeaders: &g.replayHeaders}
	call.bind(ctx, o.Lease, begun)
	st := &idemstore.Start{ID: id, Fingerprint: fp, Lease: lease, LeaseUntil: now.Add(o.Lease), ExpiresAt: now.Add(o.TTL), Token: claim, Now: now}
	if o.Windows != nil && o.Window > 0 {
		st.WindowID = digest(scope.Principal, req.Method, req.Path, fp)
		st.WindowOwner, st.WindowUntil = idemstore.WindowOwner(id, lease), now.Add(o.Window)
		call.windowID = st.WindowID
	}
	call.deferred = &deferral{start: st}
	out := Outcome{Call: call}
	if o.ExpiryHeader {
		out.Expires = st.ExpiresAt
	}
	return out
}

// newLease is a Deferred call's lease: 128 random bits.
func newLease() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // never fails (Go 1.24+)
	return base64.RawURLEncoding.EncodeToString(b[:])
}

// wait waits, up to Options.Wait, for the in-flight first request of
// req's key to finish, asking the store again each time it is woken or a
// poll interval passed. It returns the last Begin's answer: InProgress if
// the wait ran out. It leaves that Begin's Now in req, and in begun when
// it was asked (time.Now): where the lease it gave starts.
func (g *Guard[R]) wait(ctx context.Context, r R, req *idemstore.BeginRequest, begun *time.Time) (idemstore.BeginResult, error) {
	wctx, cancel := context.WithTimeout(ctx, g.o.Wait)
	defer cancel()
	n, _ := g.o.Store.(idemstore.Notifier)
	var woken <-chan struct{}
	stop := func() {}
	defer func() { stop() }()
	watch := func() {
		stop()
		woken, stop = nil, func() {}
		if n != nil {
			if ch, st, err := n.Watch(wctx, req.ID); err == nil {
				woken, stop = ch, st
			}
		}
	}
	watch()
	// Watched: one look at once (a change between the first Begin and the
	// Watch), then a slow poll, a safety net for a lost wake-up (a Redis
	// reconnect). Else a poll that backs off.
	poll, next := 10*time.Millisecond, 10*time.Millisecond
	if woken != nil {
		poll, next = time.Second, 0
	}
	t := time.NewTimer(next)
	defer t.Stop()
	rewatch := false
	for {
		select {
		case <-wctx.Done():
			if err := ctx.Err(); errors.Is(err, context.DeadlineExceeded) {
				// The request's own deadline came first: the key is still
				// in flight, as far as anyone knows; no store failed.
				return idemstore.BeginResult{Outcome: idemstore.InProgress}, nil
			} else if err != nil {
				return idemstore.BeginResult{}, err // the client went away
			}
			// The wait ran out: one last look, then 409 as without it.
			req.Now, *begun = g.o.Now(), time.Now()
			return g.o.Store.Begin(ctx, *req)
		case _, ok := <-woken:
			if !ok {
				// A closed channel is used up; watched again below only if
				// the key is still in flight (usually it is not: the
				// wake-up was its answer, and a new watch, a LISTEN
				// connection on PostgreSQL, would be for nothing).
				woken, rewatch = nil, true
			}
		case <-t.C:
			if woken == nil {
				poll = min(2*poll, 200*time.Millisecond)
			}
		}
		req.Now, *begun = g.o.Now(), time.Now()
		res, err := g.o.Store.Begin(ctx, *req)
		if err != nil && errors.Is(ctx.Err(), context.DeadlineExceeded) {
			return idemstore.BeginResult{Outcome: idemstore.InProgress}, nil // as above
		}
		if err != nil || res.Outcome != idemstore.InProgress {
			if err == nil && res.Outcome == idemstore.Replay {
				g.event(r, "waited")
			}
			return res, err
		}
		if !t.Stop() {
			select {
			case <-t.C:
			default:
			}
		}
		if rewatch {
			// Watch anew, then one look at once, as after the first Watch.
			watch()
			rewatch = false
			t.Reset(0)
			continue
		}
		t.Reset(poll)
	}
}

// Answer is the handler's answer, as the transport buffered it.
type Answer struct {
	Status  int         // the status it wrote (200 if it wrote only a body)
	Header  http.Header // its header; only the replay headers are stored
	Body    []byte      // its body, byte for byte
	Written bool        // it wrote a status or a body
}

// Finish stores the handler's answer a as the key's answer, or frees the
// key (a 5xx unless Options.StoreServerErrors, Call.Forget). It returns
// nil when the transport is to send a as it is (adding Cache-Control:
// no-store unless the handler set it), or the problem to send instead: 503
// request_interrupted when the handler wrote nothing because the
// request's context ended, 503 store_unavailable when a refusal (not a
// 2xx) could not be stored. A success that could not be stored is sent:
// the business tables' unique constraints pin its outcome. With
// Options.OfferToken it adds the next submit token to a.Header, after the
// answer is stored: the transport sends a.Header.
func (g *Guard[R]) Finish(r R, call *Call, a Answer) *Problem {
	detached := (*detachedCall)(call)
	ended := (*callCtx)(call).Err() != nil // the request's context, or the lease's bound
	call.endCtx()
	if d := call.deferred; d != nil {
		g.local.finish(call)
		if !d.created.Load() {
			g.event(r, "unrecorded") // no record: nothing to keep or free
			return nil
		}
		g.event(r, "new")
	}
	switch {
	case (a.Status >= 500 && !g.o.StoreServerErrors) || call.has(forgotten):
		g.release(r, detached, call)
		return nil
	case !a.Written && !call.has(completed) && ended:
		// No answer: the handler gave up when its context ended (a
		// deadline, a client gone, the key's lease running out). Its empty
		// 200 is not an outcome to replay for the key's whole TTL: freed,
		// as after a 5xx.
		g.release(r, detached, call)
		return probInterrupted
	case !call.has(completed):
		h, put := g.storedHeader(a.Header)
		resp := idemstore.Response{Status: a.Status, Header: h, Body: a.Body}
		// A refusal (4xx) pins nothing: sent unstored, the key could run
		// again after its lease and answer differently. Free the key and
		// say 503 instead: the client retries. Not with StoreServerErrors:
		// the handler cannot know that its effect did not happen, so a
		// freed key could make it twice. Its answer is sent as a success's
		// is, and the key stays in flight until its lease runs out (then
		// Recovered: the handler knows it may have run).
		err := g.o.Store.Complete(detached, call.ID, call.Lease, resp, g.o.Now())
		if put {
			clear(h)
			headers.Put(h)
		}
		if err != nil && (a.Status < 200 || a.Status > 299) && !g.o.StoreServerErrors {
			g.release(r, detached, call)
			return g.fail(r, "store_unavailable", probUnavailable).Problem
		}
	}
	if g.o.OfferToken && a.Status < 500 && a.Status != http.StatusUnauthorized && a.Header != nil {
		// After the store copied what it keeps: the offer is this answer's alone.
		if next, expires := g.offer(call.parent, r, call.Scope.Principal, call.Key); next != "" {
			a.Header[HeaderNextToken] = []string{next}
			a.Header[HeaderNextTokenExpires] = []string{expires}
		}
	}
	return nil
}

// The headers of Options.OfferToken: the next submit token, and when it
// expires (RFC 3339).
const (
	HeaderNextToken        = "Next-Submit-Token"
	HeaderNextTokenExpires = "Next-Submit-Token-Expires"
)

// offer mints the next submit token for principal (Options.OfferToken)
// when key is a submit token or the route requires one: the token and its
// expiry as sent, or "" when there is none to offer.
func (g *Guard[R]) offer(ctx context.Context, r R, principal, key string) (next, expires string) {
	if principal == "" || !(g.o.RequireToken || token.IsToken(key)) {
		return "", ""
	}
	is, err := g.o.Tokens.Issue(ctx, principal, g.o.Purpose)
	if err != nil { // the client mints one itself
		return "", ""
	}
	g.event(r, "token_offered")
	return is.Token, is.ExpiresAt.UTC().Format(time.RFC3339)
}

// offerProblem returns p with the next submit token (offer), or p as it
// is: a 5xx or a 401 gets none. The shared problems are copied, not
// changed.
func (g *Guard[R]) offerProblem(ctx context.Context, r R, p *Problem, principal, key string) *Problem {
	if p == nil || p.Status >= 500 || p.Status == http.StatusUnauthorized {
		return p
	}
	next, expires := g.offer(ctx, r, principal, key)
	if next == "" {
		return p
	}
	cp := *p
	cp.next, cp.nextExpires = next, expires
	return &cp
}

// Abort frees the key of a handler that panicked, before the transport
// re-raises the panic.
func (g *Guard[R]) Abort(r R, call *Call) {
	call.endCtx()
	g.local.finish(call)
	g.release(r, (*detachedCall)(call), call)
}

// headers recycles the stored headers that storedHeader cuts out: a
// Store copies what it keeps.
var headers = sync.Pool{New: func() any { return make(http.Header) }}

// storedHeader returns h cut down to the replay headers: h itself when it
// holds nothing else (the usual case, a Content-Type), else a pooled
// header to give back (put) after Complete.
func (g *Guard[R]) storedHeader(h http.Header) (stored http.Header, put bool) {
	if g.keepsAll(h) {
		return h, false
	}
	stored = headers.Get().(http.Header)
	for k, v := range h {
		if len(v) > 0 && g.keeps(k, h) {
			stored[k] = v
		}
	}
	return stored, true
}

func (g *Guard[R]) keepsAll(h http.Header) bool {
	for k, v := range h {
		if len(v) == 0 || !g.keeps(k, h) {
			return false
		}
	}
	return true
}

// keeps reports whether the header k of h is stored.
func (g *Guard[R]) keeps(k string, h http.Header) bool {
	if !g.allHeaders {
		return slices.Contains(g.replayHeaders, k)
	}
	// Any case: net/http sends a non-canonical name as it is, and a
	// client reads it as the canonical one (h["set-cookie"] is a cookie).
	k = http.CanonicalHeaderKey(k)
	switch k {
	case "Set-Cookie", "Date", "Content-Length", "Connection", "Keep-Alive", "Proxy-Connection",
		"Proxy-Authenticate", "Proxy-Authorization", "Te", "Trailer", "Transfer-Encoding", "Upgrade",
		"Idempotent-Replayed", "Idempotency-Key-Expires":
		return false
	}
	for name, vs := range h { // the headers a Connection header names are hop-by-hop too
		if http.CanonicalHeaderKey(name) != "Connection" {
			continue
		}
		for _, v := range vs {
			for _, f := range splitComma(v) {
				if http.CanonicalHeaderKey(f) == k {
					return false
				}
			}
		}
	}
	return true
}

func splitComma(s string) []string {
	var out []string
	for len(s) > 0 {
		i := 0
		for i < len(s) && s[i] != ',' {
			i++
		}
		f := s[:i]
		for len(f) > 0 && (f[0] == ' ' || f[0] == '\t') {
			f = f[1:]
		}
		for len(f) > 0 && (f[len(f)-1] == ' ' || f[len(f)-1] == '\t') {
			f = f[:len(f)-1]
		}
		if f != "" {
			out = append(out, f)
		}
		if i == len(s) {
			break
		}
		s = s[i+1:]
	}
	return out
}

func (g *Guard[R]) event(r R, ev string) {
	if g.o.OnEvent != nil {
		g.o.OnEvent(r, ev)
	}
}

func (g *Guard[R]) fail(r R, ev string, p *Problem) Outcome {
	g.event(r, ev)
	return Outcome{Problem: p}
}

// release frees a key whose request must be allowed to run again.
func (g *Guard[R]) release(r R, ctx context.Context, call *Call) {
	_ = g.o.Store.Abandon(ctx, call.ID, call.Lease)
	g.local.dropWindow(call)
	if call.windowID != "" {
		_ = g.o.Windows.FreeWindow(ctx, call.windowID, idemstore.WindowOwner(call.ID, call.Lease))
	}
	g.event(r, "released")
}

func (g *Guard[R]) tokenError(ctx context.Context, r R, err error) Outcome {
	if errors.Is(err, token.ErrForeign) {
		return g.fail(r, "token_foreign", probTokenInvalid) // the same answer: no hint that the token exists
	}
	if errors.Is(err, token.ErrInvalid) {
		return g.fail(r, "token_invalid", probTokenInvalid)
	}
	return g.storeFailed(ctx, r, err)
}

// storeFailed answers a store error before the handler ran: 503
// store_unavailable, or 503 request_interrupted ("interrupted") when the
// request's context was cancelled (the client went away) and the store
// gave up with it. That store did not fail: it must not show as an
// unreachable store in the metrics and alerts.
func (g *Guard[R]) storeFailed(ctx context.Context, r R, err error) Outcome {
	if errors.Is(err, context.Canceled) && ctx.Err() != nil {
		return g.fail(r, "interrupted", probInterrupted)
	}
	return g.fail(r, "store_unavailable", probUnavailable)
}

// keyField returns the key in the body's field name, as header values: a
// form field of an application/x-www-form-urlencoded body, else a
// top-level string member of a JSON object. None: nil (the key is
// missing); two, or one that is not a string: two values (invalid).
func keyField(contentType string, body []byte, name string) []string {
	mt, _, _ := mime.ParseMediaType(contentType)
	if mt == "application/x-www-form-urlencoded" {
		form, err := url.ParseQuery(string(body))
		if err != nil {
			return []string{"", ""}
		}
		return form[name]
	}
	var obj map[string]json.RawMessage
	if json.Unmarshal(body, &obj) != nil {
		return nil // not a JSON object: no field; the fingerprint says what is wrong with it
	}
	raw, ok := obj[name]
	if !ok {
		return nil
	}
	var s string
	if json.Unmarshal(raw, &s) != nil {
		return []string{"", ""}
	}
	return []string{s}
}

// ReplayHeader returns the header of a replay of resp: its stored
// header's values, copied (the store's are read-only), with
// Idempotent-Replayed: true and Cache-Control: no-store, and
// Idempotency-Key-Expires when expires is set. One allocation holds the
// values. A transport whose header is an http.Header writes it with
// ReplayTo.
func ReplayHeader(resp *idemstore.Response, expires time.Time) http.Header {
	h := make(http.Header, len(resp.Header)+3)
	replayHeader(h, resp, expires)
	return h
}

// replayHeader adds the header of a replay of resp to h.
func replayHeader(h http.Header, resp *idemstore.Response, expires time.Time) {
	n := 2
	if !expires.IsZero() {
		n++
	}
	m := n
	for _, v := range resp.Header {
		n += len(v)
	}
	vals := make([]string, 0, n)
	for k, v := range resp.Header {
		i := len(vals)
		vals = append(vals, v...)
		h[k] = vals[i:len(vals):len(vals)]
	}
	i := len(vals)
	vals = append(vals, "true", "no-store")
	h["Idempotent-Replayed"] = vals[i : i+1 : i+1]
	h["Cache-Control"] = vals[i+1 : i+2 : i+2]
	if m == 3 {
		vals = append(vals, expires.UTC().Format(http.TimeFormat))
		h["Idempotency-Key-Expires"] = vals[i+2 : i+3 : i+3]
	}
}

// FirstHeader adds to h, the header of a first answer about to be sent
// (after Finish returned nil), what the Guard's options ask for:
// Cache-Control: no-store unless the handler set Cache-Control,
// Idempotent-Replayed: false (MarkFirst), Idempotency-Key-Expires
// (ExpiryHeader, when expires is set).
func (g *Guard[R]) FirstHeader(h http.Header, expires time.Time) {
	if _, ok := h["Cache-Control"]; !ok {
		h["Cache-Control"] = []string{"no-store"}
	}
	if g.o.MarkFirst {
		h["Idempotent-Replayed"] = []string{"false"}
	}
	if !expires.IsZero() {
		h["Idempotency-Key-Expires"] = []string{expires.UTC().Format(http.TimeFormat)}
	}
}

// Context returns the handler's context: the request's, with the Call
// (FromContext), ending at nine tenths of the key's lease unless the
// request's ends first (Options.Lease). A transport gives it to the
// handler.
func (c *Call) Context() context.Context { return (*callCtx)(c) }
