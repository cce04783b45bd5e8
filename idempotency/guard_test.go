package idempotency_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/onceguard/onceguard/idempotency"
	"github.com/onceguard/onceguard/idempotency/idemstore"
	"github.com/onceguard/onceguard/idempotency/memstore"
	"github.com/onceguard/onceguard/token"
)

// counting is a handler that counts its runs and answers status with
// the run's number.
type counting struct {
	runs   atomic.Int32
	status int
	header http.Header
	forget bool
}

func (c *counting) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	n := c.runs.Add(1)
	for k, v := range c.header {
		w.Header()[k] = v
	}
	if c.forget {
		call, _ := idempotency.FromContext(r.Context())
		call.Forget()
	}
	w.Header().Set("Content-Type", "text/plain")
	w.WriteHeader(c.status)
	_, _ = w.Write([]byte(strings.Repeat("x", int(n))))
}

func send(h http.Handler, key, contentType, body string) *httptest.ResponseRecorder {
	r := httptest.NewRequest(http.MethodPost, "/pay", strings.NewReader(body))
	if key != "" {
		r.Header.Set("Idempotency-Key", key)
	}
	if contentType != "" {
		r.Header.Set("Content-Type", contentType)
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

func codeOf(w *httptest.ResponseRecorder) string {
	if !strings.HasPrefix(w.Header().Get("Content-Type"), "application/problem+json") {
		return ""
	}
	_, rest, _ := strings.Cut(w.Body.String(), `"code":"`)
	code, _, _ := strings.Cut(rest, `"`)
	return code
}

// The key from a field of the body, form or JSON; a header too must
// name the same key.
func TestKeyField(t *testing.T) {
	c := &counting{status: 201}
	h := idempotency.Middleware(idempotency.Config{Store: &memstore.Store{}, KeyField: "withdraw_token",
		Fingerprint: func(_ *http.Request, body []byte) (string, error) { return string(body), nil }})(c)
	const form = "application/x-www-form-urlencoded"
	for i, tc := range []struct {
		key, ct, body string
		status        int
		code          string
		replayed      bool
		runs          int32
	}{
		{"", form, "amount=1&withdraw_token=t1", 201, "", false, 1},
		{"", form, "amount=1&withdraw_token=t1", 201, "", true, 1},                      // the same key: replayed
		{"", form + "; charset=utf-8", "amount=2&withdraw_token=t2", 201, "", false, 2}, // parameters are fine
		{"", "application/json", `{"withdraw_token":"t3","amount":1}`, 201, "", false, 3},
		{"", "application/json", `{"withdraw_token":"t1","amount":1}`, 422, "idempotency_key_reused", false, 3}, // t1 named a form
		{"", "application/json", `{"withdraw_token":"t3","amount":1}`, 201, "", true, 3},
		{"h1", form, "amount=1&withdraw_token=t1", 201, "", false, 4},     // the header wins: another key
		{`"t1"`, form, "amount=1&withdraw_token=t1", 201, "", true, 4},    // the header names the field's key
		{"h1", form, "amount=1", 422, "idempotency_key_reused", false, 4}, // h1 named a body with the field
		{"", form, "amount=1", 400, "idempotency_key_missing", false, 4},
		{"", "application/json", `{"amount":1}`, 400, "idempotency_key_missing", false, 4},
		{"", "application/json", `{"withdraw_token":7}`, 400, "idempotency_key_invalid", false, 4},
		{"", form, "withdraw_token=a&withdraw_token=b", 400, "idempotency_key_invalid", false, 4},
		{"", form, "withdraw_token=has%20space", 400, "idempotency_key_invalid", false, 4},
		{"", form, "withdraw_token=%zz", 400, "idempotency_key_invalid", false, 4},
	} {
		w := send(h, tc.key, tc.ct, tc.body)
		if w.Code != tc.status || codeOf(w) != tc.code || (w.Header().Get("Idempotent-Replayed") == "true") != tc.replayed || c.runs.Load() != tc.runs {
			t.Errorf("%d: %q %q: %d %q replayed=%q, %d runs; want %d %q replayed=%v, %d runs", i, tc.ct, tc.body,
				w.Code, codeOf(w), w.Header().Get("Idempotent-Replayed"), c.runs.Load(), tc.status, tc.code, tc.replayed, tc.runs)
		}
	}
}

// Without a key, a KeyOptional route runs every time, unprotected and
// counted; with one, it is protected as always.
func TestKeyOptional(t *testing.T) {
	c := &counting{status: 201}
	var mu sync.Mutex
	var events []string
	h := idempotency.Middleware(idempotency.Config{Store: &memstore.Store{}, KeyOptional: true,
		OnEvent: func(_ *http.Request, ev string) { mu.Lock(); events = append(events, ev); mu.Unlock() }})(c)
	for range 2 {
		if w := send(h, "", "", `{}`); w.Code != 201 || w.Header().Get("Idempotent-Replayed") != "" {
			t.Errorf("no key: %d %v; want 201, not a replay", w.Code, w.Header())
		}
	}
	send(h, "k", "", `{}`)
	if w := send(h, "k", "", `{}`); w.Header().Get("Idempotent-Replayed") != "true" {
		t.Errorf("with a key: not replayed")
	}
	if w := send(h, "bad key", "", `{}`); codeOf(w) != "idempotency_key_invalid" {
		t.Errorf("an invalid key on an optional route: %q; want idempotency_key_invalid", codeOf(w))
	}
	if c.runs.Load() != 3 {
		t.Errorf("%d runs; want 3 (two unprotected, one keyed)", c.runs.Load())
	}
	if got := strings.Join(events, ","); got != "unprotected,unprotected,new,replayed,key_invalid" {
		t.Errorf("events %s", got)
	}
}

// StoreServerErrors keeps a 5xx as the key's answer; Forget still frees.
func TestStoreServerErrors(t *testing.T) {
	c := &counting{status: 502}
	h := idempotency.Middleware(idempotency.Config{Store: &memstore.Store{}, StoreServerErrors: true})(c)
	send(h, "k", "", `{}`)
	w := send(h, "k", "", `{}`)
	if w.Code != 502 || w.Header().Get("Idempotent-Replayed") != "true" || w.Body.String() != "x" || c.runs.Load() != 1 {
		t.Errorf("5xx again: %d %q replayed=%q, %d runs; want the stored 502, 1 run", w.Code, w.Body, w.Header().Get("Idempotent-Replayed"), c.runs.Load())
	}
	c.forget = true
	send(h, "k2", "", `{}`)
	if w := send(h, "k2", "", `{}`); w.Header().Get("Idempotent-Replayed") != "" || c.runs.Load() != 3 {
		t.Errorf("a forgotten 5xx was kept: %d runs; want 3", c.runs.Load())
	}
	// Without the option, a 5xx frees the key as before.
	c2 := &counting{status: 503}
	h2 := idempotency.Middleware(idempotency.Config{Store: &memstore.Store{}})(c2)
	send(h2, "k", "", `{}`)
	send(h2, "k", "", `{}`)
	if c2.runs.Load() != 2 {
		t.Errorf("default: a 5xx ran %d times for two sends; want 2 (freed)", c2.runs.Load())
	}
}

// ReplayHeaders "*" keeps every header but the ones that belong to one
// connection or one answer.
func TestReplayAllHeaders(t *testing.T) {
	c := &counting{status: 200, header: http.Header{
		"X-Request-Cost": {"3"}, "Link": {"</a>", "</b>"}, "Set-Cookie": {"s=1"}, "Date": {"Mon, 01 Jan 2024 00:00:00 GMT"},
		"Connection": {"X-Hop, close"}, "X-Hop": {"1"}, "Keep-Alive": {"timeout=5"}, "Transfer-Encoding": {"chunked"},
	}}
	h := idempotency.Middleware(idempotency.Config{Store: &memstore.Store{}, ReplayHeaders: []string{"*"}})(c)
	send(h, "k", "", `{}`)
	w := send(h, "k", "", `{}`)
	got := w.Header()
	if got.Get("X-Request-Cost") != "3" || strings.Join(got.Values("Link"), ",") != "</a>,</b>" || got.Get("Content-Type") != "text/plain" {
		t.Errorf("replay lost headers: %v", got)
	}
	for _, k := range []string{"Set-Cookie", "Date", "Connection", "X-Hop", "Keep-Alive", "Transfer-Encoding"} {
		if _, ok := got[k]; ok {
			t.Errorf("replay carries %s: %v", k, got)
		}
	}
	if got.Get("Idempotent-Replayed") != "true" || got.Get("Cache-Control") != "no-store" {
		t.Errorf("replay marks: %v", got)
	}
}

// MarkFirst and ExpiryHeader: the first answer says it is not a replay
// and until when the key holds, the replay says the same expiry.
func TestMarkFirstAndExpiry(t *testing.T) {
	now := time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)
	c := &counting{status: 201}
	h := idempotency.Middleware(idempotency.Config{Store: &memstore.Store{}, MarkFirst: true, ExpiryHeader: true,
		TTL: 2 * time.Hour, Now: func() time.Time { return now }})(c)
	want := "Wed, 02 Dec 2026 12:00:00 GMT"
	w := send(h, "k", "", `{}`)
	if w.Header().Get("Idempotent-Replayed") != "false" || w.Header().Get("Idempotency-Key-Expires") != want || w.Header().Get("Cache-Control") != "no-store" {
		t.Errorf("first answer: %v; want Idempotent-Replayed: false, Idempotency-Key-Expires: %s", w.Header(), want)
	}
	now = now.Add(time.Hour)
	w = send(h, "k", "", `{}`)
	if w.Header().Get("Idempotent-Replayed") != "true" || w.Header().Get("Idempotency-Key-Expires") != want {
		t.Errorf("replay: %v; want Idempotent-Replayed: true, Idempotency-Key-Expires: %s", w.Header(), want)
	}
	// Off by default: neither header.
	h = idempotency.Middleware(idempotency.Config{Store: &memstore.Store{}})(c)
	w = send(h, "k", "", `{}`)
	if _, ok := w.Header()["Idempotent-Replayed"]; ok || w.Header().Get("Idempotency-Key-Expires") != "" {
		t.Errorf("default first answer: %v", w.Header())
	}
}

// polled hides a store's Notifier: a waiting retry polls it.
type polled struct {
	idemstore.Store
	waiting inFlight
}

func (p *polled) Begin(ctx context.Context, r idemstore.BeginRequest) (idemstore.BeginResult, error) {
	res, err := p.Store.Begin(ctx, r)
	p.waiting.saw(ctx, res)
	return res, err
}

func (p *polled) inFlight() int { return p.waiting.n() }

// notified is a memstore, with its Notifier, that tells which requests
// found their key in flight.
type notified struct {
	*memstore.Store
	waiting inFlight
}

func (n *notified) Begin(ctx context.Context, r idemstore.BeginRequest) (idemstore.BeginResult, error) {
	res, err := n.Store.Begin(ctx, r)
	n.waiting.saw(ctx, res)
	return res, err
}

func (n *notified) inFlight() int { return n.waiting.n() }

var _ idemstore.Notifier = (*notified)(nil)

// requestID tags a request's context, for inFlight.
type requestID struct{}

// inFlight is the set of requests (by their requestID) that found their
// key in flight: those that are waiting, under Wait.
type inFlight struct {
	mu   sync.Mutex
	seen map[any]bool
}

func (f *inFlight) saw(ctx context.Context, res idemstore.BeginResult) {
	if id := ctx.Value(requestID{}); id != nil && res.Outcome == idemstore.InProgress {
		f.mu.Lock()
		if f.seen == nil {
			f.seen = map[any]bool{}
		}
		f.seen[id] = true
		f.mu.Unlock()
	}
}

func (f *inFlight) n() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.seen)
}

type waitStore interface {
	idemstore.Store
	inFlight() int
}

// With Wait, a retry that arrives while the first is in flight waits for
// its answer and replays it, woken by the store or polling it; past the
// wait, 409 as without it.
func TestWait(t *testing.T) {
	for _, tc := range []struct {
		name  string
		store func() waitStore
	}{
		{"notified", func() waitStore { return &notified{Store: &memstore.Store{}} }},
		{"polled", func() waitStore { return &polled{Store: &memstore.Store{}} }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			release := make(chan struct{})
			started := make(chan struct{}, 10)
			var runs atomic.Int32
			var mu sync.Mutex
			var events []string
			handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				runs.Add(1)
				started <- struct{}{}
				<-release
				w.WriteHeader(201)
				_, _ = w.Write([]byte("done"))
			})
			store := tc.store()
			h := idempotency.Middleware(idempotency.Config{Store: store, Wait: time.Minute,
				OnEvent: func(_ *http.Request, ev string) { mu.Lock(); events = append(events, ev); mu.Unlock() }})(handler)
			first := make(chan *httptest.ResponseRecorder)
			go func() { first <- send(h, "k", "", `{}`) }()
			<-started
			const waiters = 5
			answers := make(chan *httptest.ResponseRecorder, waiters)
			for i := range waiters {
				go func() {
					r := httptest.NewRequest(http.MethodPost, "/pay", strings.NewReader(`{}`))
					r = r.WithContext(context.WithValue(r.Context(), requestID{}, i))
					r.Header.Set("Idempotency-Key", "k")
					w := httptest.NewRecorder()
					h.ServeHTTP(w, r)
					answers <- w
				}()
			}
			// Every waiter found the key in flight: they are waiting. Only
			// then the first may finish, else a late waiter is a plain
			// replay, not a wait (a fixed sleep was not enough on a loaded
			// machine).
			deadline := time.Now().Add(60 * time.Second)
			for store.inFlight() < waiters && time.Now().Before(deadline) {
				time.Sleep(time.Millisecond)
			}
			if n := store.inFlight(); n < waiters {
				t.Fatalf("%d waiters found the key in flight in 60 s; want %d", n, waiters)
			}
			select {
			case w := <-answers:
				t.Fatalf("a waiter was answered %d before the first finished", w.Code)
			default:
			}
			close(release)
			if w := <-first; w.Code != 201 {
				t.Fatalf("first: %d", w.Code)
			}
			for range waiters {
				w := <-answers
				if w.Code != 201 || w.Body.String() != "done" || w.Header().Get("Idempotent-Replayed") != "true" {
					t.Errorf("waiter: %d %q replayed=%q; want the first answer, replayed", w.Code, w.Body, w.Header().Get("Idempotent-Replayed"))
				}
			}
			if runs.Load() != 1 {
				t.Errorf("%d runs; want 1", runs.Load())
			}
			mu.Lock()
			if got := strings.Count(strings.Join(events, ","), "waited"); got != waiters {
				t.Errorf("%d waited events; want %d: %v", got, waiters, events)
			}
			mu.Unlock()
		})
	}

	// A wait that runs out answers 409, as without it.
	release := make(chan struct{})
	defer close(release)
	started := make(chan struct{})
	h := idempotency.Middleware(idempotency.Config{Store: &memstore.Store{}, Wait: 30 * time.Millisecond})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		close(started)
		<-release
	}))
	go send(h, "k", "", `{}`)
	<-started
	if w := send(h, "k", "", `{}`); w.Code != 409 || codeOf(w) != "request_in_progress" {
		t.Errorf("past the wait: %d %q; want 409 request_in_progress", w.Code, codeOf(w))
	}
}

// The Guard serves a transport that is not HTTP at all: here a function
// call whose request is a string, as a queue consumer or an RPC would.
func TestGuardWithoutHTTP(t *testing.T) {
	type msg struct{ user, key, body string }
	g := idempotency.NewGuard(idempotency.Options[*msg]{Store: &memstore.Store{},
		Principal: func(m *msg) (string, error) { return m.user, nil }})
	runs := 0
	handle := func(m *msg) (int, string, bool) {
		out := g.Begin(context.Background(), m, &idempotency.Request{Method: "CALL", Path: "/svc.Pay", Key: []string{m.key}, Body: []byte(m.body)})
		switch {
		case out.Problem != nil:
			return out.Problem.Status, out.Problem.Code, false
		case out.Replay != nil:
			return out.Replay.Status, string(out.Replay.Body), true
		}
		if _, ok := idempotency.FromContext(out.Call.Context()); !ok {
			t.Fatal("the Call's context does not carry it")
		}
		runs++
		a := idempotency.Answer{Status: 200, Body: []byte("paid " + m.body), Written: true}
		if p := g.Finish(m, out.Call, a); p != nil {
			return p.Status, p.Code, false
		}
		return a.Status, string(a.Body), false
	}
	for i, tc := range []struct {
		m        msg
		status   int
		body     string
		replayed bool
	}{
		{msg{"ann", "k1", `{"n":1}`}, 200, `paid {"n":1}`, false},
		{msg{"ann", "k1", `{"n":1}`}, 200, `paid {"n":1}`, true},
		{msg{"bob", "k1", `{"n":1}`}, 200, `paid {"n":1}`, false}, // another principal's key
		{msg{"ann", "k1", `{"n":2}`}, 422, "idempotency_key_reused", false},
		{msg{"ann", "", `{"n":2}`}, 400, "idempotency_key_missing", false},
	} {
		status, body, replayed := handle(&tc.m)
		if status != tc.status || body != tc.body || replayed != tc.replayed {
			t.Errorf("%d: %d %q %v; want %d %q %v", i, status, body, replayed, tc.status, tc.body, tc.replayed)
		}
	}
	if runs != 2 {
		t.Errorf("%d runs; want 2", runs)
	}
}

// OfferToken needs signed Tokens: a stored token's mint is a write, which
// an answer must not make for a token the client may never use.
func TestOfferTokenNeedsSignedTokens(t *testing.T) {
	store := &memstore.Store{}
	for name, tokens := range map[string]*token.Tokens{"none": nil, "stored": token.New(store, nil)} {
		t.Run(name, func(t *testing.T) {
			defer func() {
				if got := recover(); got != "idempotency: OfferToken needs signed Tokens (token.Options.Key), whose minting writes nothing" {
					t.Errorf("panic %v; want OfferToken's", got)
				}
			}()
			idempotency.NewGuard(idempotency.Config{Store: store, Tokens: tokens, Purpose: "pay", OfferToken: true})
		})
	}
}
