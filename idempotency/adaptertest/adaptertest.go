// Package adaptertest is the conformance suite of an adapter of
// idempotency.Guard to a web framework: it runs the HTTP contract's cases
// against a real server of the framework on a loopback port, with the
// adapter in front of a test application, as package storetest does for a
// store:
//
//	func TestConformance(t *testing.T) {
//		adaptertest.Run(t, startServer, func(*testing.T) idemstore.FullStore { return &memstore.Store{} })
//	}
//
// where startServer builds the adapter from the Config (its Principal
// hook returning the request's X-User header) and mounts the application
// behind it.
//
// The cases: a replay byte for byte with Idempotent-Replayed: true and the
// original Content-Type, no Set-Cookie in it, and Cache-Control: no-store;
// keys scoped to their principal; 409 request_in_progress while in flight;
// 422 idempotency_key_reused; 400 for a missing or invalid key; a
// request without a key on a KeyOptional route runs unprotected; submit
// tokens; the repeat-submit window; a 5xx and a panic free the key; a
// handler that writes nothing; a handler's context that ends before the
// key's lease; streamed and large answers; a storm of 200
// same-key requests runs the handler once.
package adaptertest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/onceguard/onceguard/idempotency"
	"github.com/onceguard/onceguard/idempotency/idemstore"
	"github.com/onceguard/onceguard/token"
)

// Config is what the suite asks of the adapter it starts.
type Config struct {
	Store   idemstore.FullStore // records, tokens and the window
	Tokens  *token.Tokens       // submit tokens of Purpose; nil for none
	Purpose string
	Window  time.Duration // the repeat-submit window; 0 for none
	Lease   time.Duration // the in-flight lease; 0 for the default
	// KeyOptional runs a request without a key, unprotected.
	KeyOptional bool
	// RequireToken refuses keys that are not submit tokens; OfferToken
	// sends the next one with each answer (Tokens signed).
	RequireToken, OfferToken bool
	// OnEvent, when set, is told each of the Guard's events.
	OnEvent func(event string)
	// The adapter's Principal hook returns the request's "X-User" header
	// ("" when it is absent).
}

// Options returns the options of a Guard that cfg asks for, with
// principal as the Principal hook (it returns the request's "X-User"
// header): a Start builds its adapter from them, so that every field of
// Config reaches every adapter. idempotency.Config is Options of
// *http.Request.
func Options[R any](cfg Config, principal func(R) (string, error)) idempotency.Options[R] {
	o := idempotency.Options[R]{
		Store: cfg.Store, Tokens: cfg.Tokens, Purpose: cfg.Purpose, Window: cfg.Window, Lease: cfg.Lease,
		KeyOptional: cfg.KeyOptional, RequireToken: cfg.RequireToken, OfferToken: cfg.OfferToken, Principal: principal,
	}
	if ev := cfg.OnEvent; ev != nil {
		o.OnEvent = func(_ R, event string) { ev(event) }
	}
	return o
}

// Start starts a real server of the framework on 127.0.0.1:0 with the
// adapter, built from cfg, in front of app for every method and path, and
// returns its base URL ("http://127.0.0.1:PORT"). It stops the server
// with t.Cleanup.
type Start func(t *testing.T, cfg Config, app http.Handler) (baseURL string)

// The application's routes (all POST):
//
//	/ok      201, Content-Type: application/json; charset=utf-8, Set-Cookie,
//	         Location, a body naming the run: {"run":N,"user":...,"body":...,
//	         "call":true,"principal":...} (the body it read, whether its
//	         context has the Call, and the Call's principal)
//	/slow    as /ok, once the test releases it
//	/fail    500 on its first run, then as /ok
//	/panic   panics on its first run, then as /ok
//	/empty   writes nothing
//	/leased  writes nothing once its context ends (at most leasedWait)
//	/large   1 MiB of text/plain
//	/stream  ten chunks, each flushed
type app struct {
	runs    atomic.Int32
	mu      sync.Mutex
	effects map[string]int // user, key -> runs
	release chan struct{}  // /slow waits for it
	started chan struct{}  // /slow says it began
	failed  atomic.Bool
	paniced atomic.Bool
	// leaseEnded counts /leased runs whose context ended with
	// idempotency.ErrLeaseEnding as its cause.
	leaseEnded atomic.Int32
}

func newApp() *app {
	return &app{effects: map[string]int{}, release: make(chan struct{}), started: make(chan struct{}, 1000)}
}

// leasedWait is how long /leased waits for its context to end: ten times
// the lease the suite gives it.
const leasedWait = 4 * time.Second

// LargeSize is /large's body length.
const LargeSize = 1 << 20

func (a *app) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	run := a.runs.Add(1)
	a.mu.Lock()
	a.effects[r.Header.Get("X-User")+"\x00"+r.Header.Get("Idempotency-Key")]++
	a.mu.Unlock()
	switch r.URL.Path {
	case "/slow":
		a.started <- struct{}{}
		<-a.release
	case "/fail":
		if !a.failed.Swap(true) {
			http.Error(w, "boom", http.StatusInternalServerError)
			return
		}
	case "/panic":
		if !a.paniced.Swap(true) {
			panic("adaptertest: the handler panics")
		}
	case "/empty":
		return
	case "/leased":
		select {
		case <-r.Context().Done():
			if errors.Is(context.Cause(r.Context()), idempotency.ErrLeaseEnding) {
				a.leaseEnded.Add(1)
			}
		case <-time.After(leasedWait):
		}
		return
	case "/large":
		w.Header().Set("Content-Type", "text/plain")
		w.WriteHeader(http.StatusOK)
		_, _ = w.Write(largeBody)
		return
	case "/stream":
		w.Header().Set("Content-Type", "text/plain")
		f, _ := w.(http.Flusher)
		for i := range 10 {
			_, _ = fmt.Fprintf(w, "chunk %d\n", i)
			if f != nil {
				f.Flush()
			}
		}
		return
	}
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.Header().Set("Set-Cookie", "session=secret")
	w.Header().Set("Location", "/things/"+strconv.Itoa(int(run)))
	w.WriteHeader(http.StatusCreated)
	call, ok := idempotency.FromContext(r.Context())
	principal := ""
	if ok {
		principal = call.Scope.Principal
	}
	out, _ := json.Marshal(map[string]any{"run": run, "user": r.Header.Get("X-User"), "body": string(body), "call": ok, "principal": principal})
	_, _ = w.Write(out)
}

var largeBody = bytes.Repeat([]byte("0123456789abcdef"), LargeSize/16)

// answer is what a client got.
type answer struct {
	status int
	header http.Header
	body   []byte
	err    error
}

func (a answer) code() string {
	var p struct {
		Code string `json:"code"`
	}
	_ = json.Unmarshal(a.body, &p)
	return p.Code
}

func (a answer) String() string {
	if a.err != nil {
		return a.err.Error()
	}
	b := a.body
	if len(b) > 200 {
		b = b[:200]
	}
	return fmt.Sprintf("%d %v %q", a.status, a.header, b)
}

type client struct {
	t    *testing.T
	base string
	hc   *http.Client
}

func (c *client) send(path, user, key, contentType, body string) answer {
	req, err := http.NewRequestWithContext(context.Background(), http.MethodPost, c.base+path, strings.NewReader(body))
	if err != nil {
		c.t.Fatal(err)
	}
	if user != "" {
		req.Header.Set("X-User", user)
	}
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	if contentType == "" {
		contentType = "application/json"
	}
	req.Header.Set("Content-Type", contentType)
	resp, err := c.hc.Do(req)
	if err != nil {
		return answer{err: err}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return answer{status: resp.StatusCode, header: resp.Header, body: b, err: err}
}

// Run runs the suite: each case starts its own server with start and a
// store from newStore.
func Run(t *testing.T, start Start, newStore func(t *testing.T) idemstore.FullStore) {
	setup := func(t *testing.T, cfg Config) (*client, *app) {
		t.Helper()
		if cfg.Store == nil {
			cfg.Store = newStore(t)
		}
		a := newApp()
		t.Cleanup(func() {
			select {
			case <-a.release:
			default:
				close(a.release)
			}
		})
		base := start(t, cfg, a)
		hc := &http.Client{Timeout: 60 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 256}}
		t.Cleanup(hc.CloseIdleConnections)
		return &client{t: t, base: base, hc: hc}, a
	}
	// uniq makes the keys of one run unique: a shared database keeps the
	// records of earlier runs.
	uniq := func(_ *testing.T, k string) string { return unique(k) }

	t.Run("ReplayByteForByte", func(t *testing.T) {
		c, a := setup(t, Config{})
		key := uniq(t, "k")
		first := c.send("/ok", "ann", key, "", `{"amount":1}`)
		if first.err != nil || first.status != 201 {
			t.Fatalf("first: %v; want 201", first)
		}
		if first.header.Get("Set-Cookie") == "" || first.header.Get("Idempotent-Replayed") == "true" {
			t.Errorf("first answer: %v; want the handler's own (with its Set-Cookie), not a replay", first.header)
		}
		if first.header.Get("Cache-Control") != "no-store" {
			t.Errorf("first answer Cache-Control %q; want no-store", first.header.Get("Cache-Control"))
		}
		// The handler read the body the client sent (the adapter read it
		// first), in a context that carries the Call (FromContext, which
		// CompleteTx, Forget and MarkCompleted need), scoped to the
		// principal of the Principal hook.
		var seen struct {
			Body      string `json:"body"`
			Call      bool   `json:"call"`
			Principal string `json:"principal"`
		}
		if err := json.Unmarshal(first.body, &seen); err != nil || seen.Body != `{"amount":1}` || !seen.Call || seen.Principal != "ann" {
			t.Errorf("the handler read body %q, Call in its context %v, principal %q (%v); want the request's body and the Call of ann",
				seen.Body, seen.Call, seen.Principal, err)
		}
		for range 3 {
			again := c.send("/ok", "ann", key, "", `{"amount":1}`)
			if again.status != 201 || !bytes.Equal(again.body, first.body) {
				t.Errorf("replay: %v; want %v", again, first)
			}
			if again.header.Get("Idempotent-Replayed") != "true" || again.header.Get("Content-Type") != "application/json; charset=utf-8" ||
				again.header.Get("Location") != first.header.Get("Location") || again.header.Get("Cache-Control") != "no-store" {
				t.Errorf("replay header %v; want Idempotent-Replayed: true, the original Content-Type and Location, Cache-Control: no-store", again.header)
			}
			if again.header.Get("Set-Cookie") != "" {
				t.Errorf("replay carries Set-Cookie %q", again.header.Get("Set-Cookie"))
			}
		}
		// The JSON body's member order and whitespace do not matter.
		if again := c.send("/ok", "ann", key, "", "{ \"amount\" : 1 }"); !bytes.Equal(again.body, first.body) {
			t.Errorf("the same JSON reformatted: %v; want the replay", again)
		}
		if a.runs.Load() != 1 {
			t.Errorf("%d runs; want 1", a.runs.Load())
		}
	})

	t.Run("ScopedToPrincipal", func(t *testing.T) {
		c, a := setup(t, Config{})
		key := uniq(t, "k")
		ann := c.send("/ok", "ann", key, "", `{}`)
		bob := c.send("/ok", "bob", key, "", `{}`)
		if ann.status != 201 || bob.status != 201 || bob.header.Get("Idempotent-Replayed") == "true" || bytes.Equal(ann.body, bob.body) {
			t.Errorf("ann %v, bob %v; want two first answers", ann, bob)
		}
		if a.runs.Load() != 2 {
			t.Errorf("%d runs; want 2: one key, two principals", a.runs.Load())
		}
	})

	t.Run("InFlight409", func(t *testing.T) {
		c, a := setup(t, Config{})
		key := uniq(t, "k")
		first := make(chan answer, 1)
		go func() { first <- c.send("/slow", "ann", key, "", `{}`) }()
		<-a.started
		dup := c.send("/slow", "ann", key, "", `{}`)
		if dup.status != 409 || dup.code() != "request_in_progress" || dup.header.Get("Retry-After") == "" ||
			!strings.HasPrefix(dup.header.Get("Content-Type"), "application/problem+json") {
			t.Errorf("in flight: %v; want 409 request_in_progress, problem+json, Retry-After", dup)
		}
		close(a.release)
		f := <-first
		if again := c.send("/slow", "ann", key, "", `{}`); f.status != 201 || again.status != 201 || !bytes.Equal(again.body, f.body) {
			t.Errorf("after it finished: first %v, again %v; want the replay", f, again)
		}
		if a.runs.Load() != 1 {
			t.Errorf("%d runs; want 1", a.runs.Load())
		}
	})

	t.Run("Mismatch422", func(t *testing.T) {
		c, a := setup(t, Config{})
		key := uniq(t, "k")
		c.send("/ok", "ann", key, "", `{"amount":1}`)
		if got := c.send("/ok", "ann", key, "", `{"amount":2}`); got.status != 422 || got.code() != "idempotency_key_reused" {
			t.Errorf("same key, other body: %v; want 422 idempotency_key_reused", got)
		}
		if a.runs.Load() != 1 {
			t.Errorf("%d runs; want 1", a.runs.Load())
		}
	})

	t.Run("KeyMissingOrInvalid400", func(t *testing.T) {
		c, a := setup(t, Config{})
		problem := func(a answer) bool {
			return strings.HasPrefix(a.header.Get("Content-Type"), "application/problem+json")
		}
		if got := c.send("/ok", "ann", "", "", `{}`); got.status != 400 || got.code() != "idempotency_key_missing" || !problem(got) {
			t.Errorf("no key: %v; want 400 idempotency_key_missing, problem+json", got)
		}
		for _, k := range []string{"has space", strings.Repeat("k", 256), "\"unterminated"} {
			if got := c.send("/ok", "ann", k, "", `{}`); got.status != 400 || got.code() != "idempotency_key_invalid" || !problem(got) {
				t.Errorf("key %q: %v; want 400 idempotency_key_invalid, problem+json", k, got)
			}
		}
		if got := c.send("/ok", "ann", uniq(t, "k"), "", `{"amount":`); got.status != 400 || got.code() != "invalid_json" {
			t.Errorf("broken JSON: %v; want 400 invalid_json", got)
		}
		if a.runs.Load() != 0 {
			t.Errorf("%d runs; want 0", a.runs.Load())
		}
	})

	t.Run("KeyOptional", func(t *testing.T) {
		var unprotected atomic.Int32
		c, a := setup(t, Config{KeyOptional: true, OnEvent: func(ev string) {
			if ev == "unprotected" {
				unprotected.Add(1)
			}
		}})
		var seen struct {
			Run  int    `json:"run"`
			Body string `json:"body"`
			Call bool   `json:"call"`
		}
		// Without a key: each request runs, unprotected (no Call), with
		// its whole body, and the Guard tells it.
		for i := range 2 {
			got := c.send("/ok", "ann", "", "", `{"a":1}`)
			if err := json.Unmarshal(got.body, &seen); got.status != 201 || err != nil || seen.Run != i+1 || seen.Body != `{"a":1}` || seen.Call ||
				got.header.Get("Idempotent-Replayed") != "" {
				t.Errorf("no key, request %d: %v; want run %d's 201, unprotected, with the body", i+1, got, i+1)
			}
		}
		// With a key: guarded as always.
		key := uniq(t, "k")
		first := c.send("/ok", "ann", key, "", `{"a":1}`)
		again := c.send("/ok", "ann", key, "", `{"a":1}`)
		if err := json.Unmarshal(first.body, &seen); first.status != 201 || err != nil || !seen.Call || seen.Body != `{"a":1}` {
			t.Errorf("a key: %v; want 201 with the Call and the body", first)
		}
		if again.status != 201 || again.header.Get("Idempotent-Replayed") != "true" || !bytes.Equal(again.body, first.body) {
			t.Errorf("its retry: %v; want the replay of %v", again, first)
		}
		if r, u := a.runs.Load(), unprotected.Load(); r != 3 || u != 2 {
			t.Errorf("%d runs, %d told unprotected; want 3 (two without a key, one with), 2", r, u)
		}
	})

	t.Run("SubmitTokens", func(t *testing.T) {
		store := newStore(t)
		tokens := token.New(store, nil)
		c, a := setup(t, Config{Store: store, Tokens: tokens, Purpose: "withdrawal"})
		ctx := context.Background()
		tok, err := tokens.Issue(ctx, "ann", "withdrawal")
		if err != nil {
			t.Fatal(err)
		}
		first := c.send("/ok", "ann", tok.Token, "", `{"amount":1}`)
		again := c.send("/ok", "ann", tok.Token, "", `{"amount":1}`)
		if first.status != 201 || again.header.Get("Idempotent-Replayed") != "true" || !bytes.Equal(again.body, first.body) {
			t.Errorf("a token as the key: %v then %v; want 201 then its replay", first, again)
		}
		if got := c.send("/ok", "ann", tok.Token, "", `{"amount":2}`); got.status != 422 && got.status != 400 {
			t.Errorf("the used token with another body: %v; want 422 or 400", got)
		}
		other, err := tokens.Issue(ctx, "bob", "withdrawal")
		if err != nil {
			t.Fatal(err)
		}
		if got := c.send("/ok", "ann", other.Token, "", `{"amount":3}`); got.status != 400 || got.code() != "submit_token_invalid" {
			t.Errorf("another user's token: %v; want 400 submit_token_invalid", got)
		}
		if got := c.send("/ok", "ann", "st_"+strings.Repeat("A", 32), "", `{"amount":4}`); got.status != 400 || got.code() != "submit_token_invalid" {
			t.Errorf("an unknown token: %v; want 400 submit_token_invalid", got)
		}
		if a.runs.Load() != 1 {
			t.Errorf("%d runs; want 1", a.runs.Load())
		}
	})

	t.Run("OfferToken", func(t *testing.T) { testOfferToken(t, setup, newStore(t)) })

	t.Run("RepeatWindow", func(t *testing.T) {
		c, a := setup(t, Config{Window: time.Minute})
		body := fmt.Sprintf(`{"amount":%d}`, time.Now().UnixNano())
		first := c.send("/ok", "ann", uniq(t, "a"), "", body)
		second := c.send("/ok", "ann", uniq(t, "b"), "", body)
		if first.status != 201 || second.status != 429 || second.code() != "duplicate_submission" || second.header.Get("Retry-After") == "" {
			t.Errorf("one body under two keys: %v then %v; want 201 then 429 duplicate_submission with Retry-After", first, second)
		}
		if other := c.send("/ok", "bob", uniq(t, "c"), "", body); other.status != 201 {
			t.Errorf("another user's same body: %v; want 201", other)
		}
		if a.runs.Load() != 2 {
			t.Errorf("%d runs; want 2", a.runs.Load())
		}
	})

	t.Run("ServerErrorFreesKey", func(t *testing.T) {
		c, a := setup(t, Config{})
		key := uniq(t, "k")
		if got := c.send("/fail", "ann", key, "", `{}`); got.status != 500 {
			t.Errorf("first: %v; want 500", got)
		}
		if got := c.send("/fail", "ann", key, "", `{}`); got.status != 201 || got.header.Get("Idempotent-Replayed") == "true" {
			t.Errorf("retry after a 5xx: %v; want a new run's 201", got)
		}
		if a.runs.Load() != 2 {
			t.Errorf("%d runs; want 2", a.runs.Load())
		}
	})

	t.Run("PanicFreesKey", func(t *testing.T) {
		c, a := setup(t, Config{})
		key := uniq(t, "k")
		if got := c.send("/panic", "ann", key, "", `{}`); got.err == nil && got.status < 500 {
			t.Errorf("a panicking handler: %v; want a 5xx or a broken connection", got)
		}
		if got := c.send("/panic", "ann", key, "", `{}`); got.status != 201 || got.header.Get("Idempotent-Replayed") == "true" {
			t.Errorf("retry after a panic: %v; want a new run's 201", got)
		}
		if a.runs.Load() != 2 {
			t.Errorf("%d runs; want 2", a.runs.Load())
		}
	})

	t.Run("EmptyAnswer", func(t *testing.T) {
		c, a := setup(t, Config{})
		key := uniq(t, "k")
		first := c.send("/empty", "ann", key, "", `{}`)
		again := c.send("/empty", "ann", key, "", `{}`)
		if first.status != 200 || len(first.body) != 0 || again.status != 200 || len(again.body) != 0 || again.header.Get("Idempotent-Replayed") != "true" {
			t.Errorf("a handler that writes nothing: %v then %v; want 200 empty, then its replay", first, again)
		}
		if a.runs.Load() != 1 {
			t.Errorf("%d runs; want 1", a.runs.Load())
		}
	})

	// PITFALLS 17: the handler's context ends before the key's lease, so
	// that a handler that honours it stops before a retry may take the
	// key over; having written nothing, it frees the key (503).
	t.Run("LeaseEndsHandlerContext", func(t *testing.T) {
		c, a := setup(t, Config{Lease: 400 * time.Millisecond})
		key := uniq(t, "k")
		for i := range 2 {
			if got := c.send("/leased", "ann", key, "", `{}`); got.status != 503 || got.code() != "request_interrupted" {
				t.Fatalf("run %d: a handler stopped by the lease's end: %v; want 503 request_interrupted", i+1, got)
			}
		}
		if a.runs.Load() != 2 || a.leaseEnded.Load() != 2 {
			t.Errorf("%d runs, %d ended by the lease; want 2 and 2 (the key freed after each)", a.runs.Load(), a.leaseEnded.Load())
		}
	})

	t.Run("LargeAndStreamed", func(t *testing.T) {
		c, a := setup(t, Config{})
		for _, path := range []string{"/large", "/stream"} {
			key := uniq(t, "k")
			first := c.send(path, "ann", key, "", `{}`)
			again := c.send(path, "ann", key, "", `{}`)
			want := largeBody
			if path == "/stream" {
				var b bytes.Buffer
				for i := range 10 {
					fmt.Fprintf(&b, "chunk %d\n", i)
				}
				want = b.Bytes()
			}
			if first.status != 200 || !bytes.Equal(first.body, want) {
				t.Errorf("%s first: %d, %d bytes; want 200 and %d bytes", path, first.status, len(first.body), len(want))
			}
			if again.status != 200 || !bytes.Equal(again.body, want) || again.header.Get("Idempotent-Replayed") != "true" || again.header.Get("Content-Type") != "text/plain" {
				t.Errorf("%s replay: %d, %d bytes, %v; want 200, %d bytes, replayed, text/plain", path, again.status, len(again.body), again.header, len(want))
			}
		}
		if a.runs.Load() != 2 {
			t.Errorf("%d runs; want 2", a.runs.Load())
		}
	})

	t.Run("Storm", func(t *testing.T) {
		c, a := setup(t, Config{})
		key := uniq(t, "k")
		const n = 200
		answers := make([]answer, n)
		var wg sync.WaitGroup
		gate := make(chan struct{})
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-gate
				answers[i] = c.send("/ok", "ann", key, "", `{"amount":1}`)
			}()
		}
		close(gate)
		wg.Wait()
		var created []byte
		codes := map[int]int{}
		for _, ans := range answers {
			if ans.err != nil {
				t.Errorf("storm: %v", ans.err)
				continue
			}
			codes[ans.status]++
			switch ans.status {
			case 201:
				if created == nil {
					created = ans.body
				} else if !bytes.Equal(created, ans.body) {
					t.Errorf("storm: two different 201 bodies %q and %q", created, ans.body)
				}
			case 409:
			default:
				t.Errorf("storm: %v; want 201 or 409", ans)
			}
		}
		if a.runs.Load() != 1 {
			t.Errorf("storm of %d: %d runs (%v); want 1", n, a.runs.Load(), codes)
		}
		if again := c.send("/ok", "ann", key, "", `{"amount":1}`); again.status != 201 || (created != nil && !bytes.Equal(again.body, created)) {
			t.Errorf("after the storm: %v; want the one answer", again)
		}
	})
}

// testOfferToken: each answer of a request keyed by a submit token (or on
// a route that requires one) carries the next token, which works once as
// a minted one does; a replay, a 5xx and a plain key's answer carry none.
func testOfferToken(t *testing.T, setup func(*testing.T, Config) (*client, *app), store idemstore.FullStore) {
	if _, ok := store.(idemstore.SignedTokenStore); !ok {
		t.Skip("signed submit tokens need an idemstore.SignedTokenStore")
	}
	tokens := token.New(store, &token.Options{Key: []byte(unique("offer-key-") + strings.Repeat("k", 32))})
	var offered atomic.Int32
	cfg := Config{Store: store, Tokens: tokens, Purpose: "withdrawal", OfferToken: true, OnEvent: func(ev string) {
		if ev == "token_offered" {
			offered.Add(1)
		}
	}}
	c, a := setup(t, cfg)
	user := unique("ann")
	// next returns the answer's offered token after checking its expiry.
	next := func(what string, got answer) string {
		t.Helper()
		tok := got.header.Get(idempotency.HeaderNextToken)
		exp, err := time.Parse(time.RFC3339, got.header.Get(idempotency.HeaderNextTokenExpires))
		if !token.IsToken(tok) || err != nil || !exp.After(time.Now()) {
			t.Fatalf("%s: %v with Next-Submit-Token %q expiring %q; want a token and its expiry ahead", what, got, tok, got.header.Get(idempotency.HeaderNextTokenExpires))
		}
		return tok
	}
	none := func(what string, got answer) {
		t.Helper()
		if tok := got.header.Get(idempotency.HeaderNextToken); tok != "" || got.header.Get(idempotency.HeaderNextTokenExpires) != "" {
			t.Errorf("%s: %v offers %q; want no token", what, got, tok)
		}
	}

	first, err := tokens.Issue(context.Background(), user, "withdrawal")
	if err != nil {
		t.Fatal(err)
	}
	ok1 := c.send("/ok", user, first.Token, "", `{"amount":1}`)
	if ok1.status != 201 {
		t.Fatalf("a minted token: %v; want 201", ok1)
	}
	tok2 := next("the first answer", ok1)
	replay := c.send("/ok", user, first.Token, "", `{"amount":1}`)
	if replay.header.Get("Idempotent-Replayed") != "true" || !bytes.Equal(replay.body, ok1.body) {
		t.Fatalf("the retry: %v; want the replay of %v", replay, ok1)
	}
	none("the replay", replay)

	ok2 := c.send("/ok", user, tok2, "", `{"amount":2}`)
	if ok2.status != 201 || tok2 == first.Token {
		t.Fatalf("the offered token: %v; want 201 (a token of its own)", ok2)
	}
	tok3 := next("the offered token's answer", ok2)
	// The offered token, spent, with another body: 422, and a new one.
	reused := c.send("/ok", user, tok2, "", `{"amount":3}`)
	if reused.status != 422 || reused.code() != "idempotency_key_reused" {
		t.Fatalf("a spent token with another body: %v; want 422 idempotency_key_reused", reused)
	}
	tok4 := next("the 422", reused)
	// A 5xx keeps the key and its token for the retry: no offer.
	failed := c.send("/fail", user, tok3, "", `{"amount":4}`)
	if failed.status != 500 {
		t.Fatalf("/fail: %v; want 500", failed)
	}
	none("the 500", failed)
	retried := c.send("/fail", user, tok3, "", `{"amount":4}`)
	if retried.status != 201 {
		t.Fatalf("the 500's retry with its token: %v; want 201", retried)
	}
	next("the retry's answer", retried)
	// Another user's token: 400, and one of the sender's own.
	bobs, err := tokens.Issue(context.Background(), unique("bob"), "withdrawal")
	if err != nil {
		t.Fatal(err)
	}
	foreign := c.send("/ok", user, bobs.Token, "", `{"amount":5}`)
	if foreign.status != 400 || foreign.code() != "submit_token_invalid" {
		t.Fatalf("another user's token: %v; want 400 submit_token_invalid", foreign)
	}
	if got := c.send("/ok", user, next("the 400", foreign), "", `{"amount":5}`); got.status != 201 {
		t.Errorf("the token offered with the 400: %v; want 201", got)
	}
	if got := c.send("/ok", user, tok4, "", `{"amount":6}`); got.status != 201 {
		t.Errorf("the token offered with the 422: %v; want 201", got)
	}
	// A plain key where tokens are not required: no offer.
	none("a plain key", c.send("/ok", user, unique("plain"), "", `{"amount":7}`))
	if n := a.runs.Load(); n != 7 {
		t.Errorf("%d runs; want 7 (the 500 and its retry each ran)", n)
	}
	if n := offered.Load(); n != 7 {
		t.Errorf("told token_offered %d times; want 7 (one per offer)", n)
	}

	// A route that requires tokens offers one with its 400 to a plain key;
	// the repeat-submit window's 429 offers one too.
	cfg.RequireToken, cfg.Window, cfg.OnEvent = true, time.Minute, nil
	c, _ = setup(t, cfg)
	body := fmt.Sprintf(`{"amount":%d}`, time.Now().UnixNano())
	refused := c.send("/ok", user, unique("plain"), "", body)
	if refused.status != 400 || refused.code() != "submit_token_required" {
		t.Fatalf("a plain key where a token is required: %v; want 400 submit_token_required", refused)
	}
	got := c.send("/ok", user, next("the 400 submit_token_required", refused), "", body)
	if got.status != 201 {
		t.Fatalf("the token offered with it: %v; want 201", got)
	}
	dup := c.send("/ok", user, next("its answer", got), "", body)
	if dup.status != 429 || dup.code() != "duplicate_submission" {
		t.Fatalf("the same body under the next token: %v; want 429 duplicate_submission", dup)
	}
	next("the 429", dup)
	none("no principal", c.send("/ok", "", unique("plain"), "", body))
}

// unique returns k made unique to this run.
func unique(k string) string { return fmt.Sprintf("%s-%d", k, time.Now().UnixNano()) }
