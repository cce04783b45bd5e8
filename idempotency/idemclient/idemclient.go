// Package idemclient makes HTTP requests safe to retry: each logical request
// gets one Idempotency-Key, and every retry sends the same key and the same
// body, so a server that stores answers by key (the idempotency middleware)
// runs the operation once however many attempts reach it.
//
// A Transport retries only what is safe to retry: transport errors (the
// outcome is unknown, and the same key makes the retry harmless), 409
// request_in_progress, 429 rate_limited and 503. It never retries a business
// refusal: a 429 duplicate_submission means the same intent was already
// accepted under another key, and is returned as it is. It honours
// Retry-After, backs off with jitter between attempts, and stops at an
// overall deadline. It never mints a new key for a request whose outcome is
// unknown: the error it returns then carries the key, for the caller to
// retry with later.
package idemclient

import (
	"bytes"
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"mime"
	"net/http"
	"strconv"
	"sync"
	"time"
)

// Header is the request header that carries the key.
const Header = "Idempotency-Key"

// Defaults of Transport's zero fields.
const (
	DefaultMaxAttempts = 5
	DefaultMaxElapsed  = 30 * time.Second
	DefaultMinBackoff  = 100 * time.Millisecond
	DefaultMaxBackoff  = 5 * time.Second
	// DefaultMaxBody bounds a request body the transport must buffer to
	// send again (one whose http.Request has no GetBody).
	DefaultMaxBody = 1 << 20
)

// ErrOutcomeUnknown is returned, wrapped in an *Error, when the last attempt
// ended without an answer: the server may or may not have run the request,
// and only a retry with the same key can tell.
var ErrOutcomeUnknown = errors.New("idemclient: outcome unknown")

// ErrBodyTooLarge is returned when a body without GetBody exceeds MaxBody.
var ErrBodyTooLarge = errors.New("idemclient: request body too large to retry")

// Error reports a request that got no answer; Key is the key it was sent
// with, to retry the same intent later.
type Error struct {
	Key      string
	Attempts int
	Err      error // the last attempt's error
}

func (e *Error) Error() string {
	return fmt.Sprintf("idemclient: no answer after %d attempts with key %s: %v", e.Attempts, e.Key, e.Err)
}

// Unwrap lets errors.Is find ErrOutcomeUnknown and the last attempt's error.
func (e *Error) Unwrap() []error { return []error{ErrOutcomeUnknown, e.Err} }

// Transport is an http.RoundTripper that sends POST and PATCH requests with
// an Idempotency-Key and retries them safely. A request that already carries
// the header keeps its key; other methods pass through once, unchanged.
type Transport struct {
	// Base sends each attempt; nil means http.DefaultTransport.
	Base http.RoundTripper
	// NewKey mints the key of a request that has none (for example by
	// fetching a submit token); nil means 128 random bits in hex.
	NewKey func(*http.Request) (string, error)
	// Offers, when set, keeps the submit tokens the server offers with
	// its answers and gives each out once as the key of a later request
	// to the same route, before NewKey is asked: a form-like client
	// chains its tokens instead of minting one per request.
	Offers *Offers
	// MaxAttempts bounds the attempts per request; 0 means DefaultMaxAttempts.
	MaxAttempts int
	// MaxElapsed bounds the time from the first attempt to the start of the
	// last; 0 means DefaultMaxElapsed. The request's context bounds it too.
	MaxElapsed time.Duration
	// MinBackoff and MaxBackoff bound the jittered exponential wait between
	// attempts when the server gives no Retry-After; 0 means the defaults.
	MinBackoff, MaxBackoff time.Duration
	// MaxBody bounds a body buffered for retries; 0 means DefaultMaxBody.
	MaxBody int64

	// sleep waits d or until ctx is done; tests replace it.
	sleep func(ctx context.Context, d time.Duration) error
}

// NewKey returns a fresh random key: mint one per intent (one order, one
// payout) and keep it for every retry of that intent.
func NewKey() string {
	var b [16]byte
	_, _ = crand.Read(b[:]) // never fails: crypto/rand panics instead
	return hex.EncodeToString(b[:])
}

// Key returns the Idempotency-Key that resp's request was sent with.
func Key(resp *http.Response) string {
	if resp == nil || resp.Request == nil {
		return ""
	}
	return resp.Request.Header.Get(Header)
}

// Replayed reports whether resp is a stored answer replayed by the server
// (Idempotent-Replayed: true) rather than the first execution's.
func Replayed(resp *http.Response) bool {
	return resp != nil && resp.Header.Get("Idempotent-Replayed") == "true"
}

// RoundTrip implements http.RoundTripper.
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.Method != http.MethodPost && req.Method != http.MethodPatch && req.Header.Get(Header) == "" {
		return t.base().RoundTrip(req)
	}
	getBody, err := t.replayable(req)
	if err != nil {
		return nil, err
	}
	key := req.Header.Get(Header)
	if key == "" && t.Offers != nil {
		key = t.Offers.take(req, time.Now())
	}
	if key == "" {
		if key, err = t.newKey(req); err != nil {
			return nil, fmt.Errorf("idemclient: minting a key: %w", err)
		}
	}
	ctx := req.Context()
	start := time.Now()
	maxAttempts := or(t.MaxAttempts, DefaultMaxAttempts)
	deadline := start.Add(or(t.MaxElapsed, DefaultMaxElapsed))
	for attempt := 1; ; attempt++ {
		r := req.Clone(ctx)
		r.Header.Set(Header, key)
		if getBody != nil {
			if r.Body, err = getBody(); err != nil {
				if attempt > 1 { // an earlier attempt's outcome is unknown: keep its key
					return nil, &Error{Key: key, Attempts: attempt - 1, Err: err}
				}
				return nil, err
			}
		}
		resp, err := t.base().RoundTrip(r)
		if err == nil && t.Offers != nil {
			t.Offers.keep(r, resp)
		}
		var wait time.Duration
		if err != nil {
			if ctx.Err() != nil {
				return nil, &Error{Key: key, Attempts: attempt, Err: ctx.Err()}
			}
			wait = t.backoff(attempt)
		} else {
			retry, after := t.retryable(resp)
			if !retry {
				return resp, nil
			}
			wait = max(after, t.backoff(attempt))
		}
		if attempt >= maxAttempts || time.Now().Add(wait).After(deadline) {
			if err != nil {
				return nil, &Error{Key: key, Attempts: attempt, Err: err}
			}
			return resp, nil // the server's own answer, for the caller to read
		}
		if resp != nil {
			drain(resp)
		}
		if serr := t.wait(ctx, wait); serr != nil {
			return nil, &Error{Key: key, Attempts: attempt, Err: serr}
		}
	}
}

// Offers keeps the submit tokens a server hands out with its answers
// (Next-Submit-Token, with Next-Submit-Token-Expires: a server with
// idempotency.Options.OfferToken, as the reference service's money
// routes) and gives each out once, newest first, as the key of a later
// request to the same method, host and path (a route keeps one purpose).
// One that expires within OfferMargin is not given out. It keeps at most
// MaxOffers per route, dropping the oldest. The zero Offers is ready to
// use; it is safe for concurrent use. Give each principal (each signed-in
// user) an Offers of its own: a token works only for the user it was
// offered to.
type Offers struct {
	mu     sync.Mutex
	routes map[string][]offer // by route, oldest first
}

type offer struct {
	token   string
	expires time.Time
}

// Limits of Offers.
const (
	MaxOffers   = 8               // kept per route
	OfferMargin = 5 * time.Second // an offer expiring sooner is not given out
)

func offerRoute(req *http.Request) string {
	return req.Method + " " + req.URL.Host + req.URL.Path
}

// keep keeps the offer of resp, the answer to req, if it has one.
func (o *Offers) keep(req *http.Request, resp *http.Response) {
	tok := resp.Header.Get("Next-Submit-Token")
	exp, err := time.Parse(time.RFC3339, resp.Header.Get("Next-Submit-Token-Expires"))
	if tok == "" || err != nil {
		return
	}
	route := offerRoute(req)
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.routes == nil {
		o.routes = make(map[string][]offer)
	}
	held := append(o.routes[route], offer{tok, exp})
	if len(held) > MaxOffers {
		held = append(held[:0], held[len(held)-MaxOffers:]...)
	}
	o.routes[route] = held
}

// take gives out the newest offer for req's route that does not expire
// within OfferMargin of now, and forgets it; "" when there is none.
func (o *Offers) take(req *http.Request, now time.Time) string {
	route := offerRoute(req)
	o.mu.Lock()
	defer o.mu.Unlock()
	held := o.routes[route]
	for len(held) > 0 {
		last := held[len(held)-1]
		held = held[:len(held)-1]
		if last.expires.After(now.Add(OfferMargin)) {
			o.routes[route] = held
			return last.token
		}
	}
	delete(o.routes, route)
	return ""
}

// retryable reads resp's problem code where the status needs it and reports
// whether the attempt should be repeated, and the server's Retry-After.
// A response that is returned keeps a readable body.
func (t *Transport) retryable(resp *http.Response) (bool, time.Duration) {
	switch resp.StatusCode {
	case http.StatusServiceUnavailable:
		return true, retryAfter(resp)
	case http.StatusConflict, http.StatusTooManyRequests:
	default:
		return false, 0
	}
	code := problemCode(resp)
	if (resp.StatusCode == http.StatusConflict && code == "request_in_progress") ||
		(resp.StatusCode == http.StatusTooManyRequests && code == "rate_limited") {
		return true, retryAfter(resp)
	}
	return false, 0
}

// problemCode returns the code member of a problem+json body, leaving the
// body readable from its start.
func problemCode(resp *http.Response) string {
	if mt, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type")); mt != "application/problem+json" && mt != "application/json" {
		return ""
	}
	const limit = 64 << 10
	raw, err := io.ReadAll(io.LimitReader(resp.Body, limit))
	rest := resp.Body
	resp.Body = struct {
		io.Reader
		io.Closer
	}{io.MultiReader(bytes.NewReader(raw), rest), rest}
	if err != nil {
		return ""
	}
	var p struct {
		Code string `json:"code"`
	}
	if json.Unmarshal(raw, &p) != nil {
		return ""
	}
	return p.Code
}

// retryAfter parses Retry-After as seconds or an HTTP date; 0 if absent.
func retryAfter(resp *http.Response) time.Duration {
	v := resp.Header.Get("Retry-After")
	if v == "" {
		return 0
	}
	if s, err := strconv.Atoi(v); err == nil && s >= 0 {
		return time.Duration(s) * time.Second
	}
	if at, err := http.ParseTime(v); err == nil {
		return max(time.Until(at), 0)
	}
	return 0
}

// backoff is a full-jitter exponential wait before attempt+1.
func (t *Transport) backoff(attempt int) time.Duration {
	lo, hi := or(t.MinBackoff, DefaultMinBackoff), or(t.MaxBackoff, DefaultMaxBackoff)
	hi = max(hi, lo) // as idemgrpc's: rand.N panics when hi < lo/2
	d := lo << min(attempt-1, 20)
	if d <= 0 || d > hi {
		d = hi
	}
	return lo/2 + rand.N(d-lo/2+1)
}

// replayable returns a function that yields the request body afresh for
// each attempt, buffering it when the request has no GetBody.
func (t *Transport) replayable(req *http.Request) (func() (io.ReadCloser, error), error) {
	if req.Body == nil || req.Body == http.NoBody {
		return nil, nil
	}
	if req.GetBody != nil {
		_ = req.Body.Close() // each attempt sends a fresh copy
		return req.GetBody, nil
	}
	limit := or(t.MaxBody, DefaultMaxBody)
	raw, err := io.ReadAll(io.LimitReader(req.Body, limit+1))
	_ = req.Body.Close()
	if err != nil {
		return nil, err
	}
	if int64(len(raw)) > limit {
		return nil, ErrBodyTooLarge
	}
	return func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(raw)), nil }, nil
}

func (t *Transport) newKey(req *http.Request) (string, error) {
	if t.NewKey != nil {
		return t.NewKey(req)
	}
	return NewKey(), nil
}

func (t *Transport) base() http.RoundTripper {
	if t.Base != nil {
		return t.Base
	}
	return http.DefaultTransport
}

func (t *Transport) wait(ctx context.Context, d time.Duration) error {
	if t.sleep != nil {
		return t.sleep(ctx, d)
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-timer.C:
		return nil
	}
}

// drain reads a little of a discarded answer so its connection can be reused.
func drain(resp *http.Response) {
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 4<<10))
	_ = resp.Body.Close()
}

func or[T comparable](v, def T) T {
	var zero T
	if v == zero {
		return def
	}
	return v
}
