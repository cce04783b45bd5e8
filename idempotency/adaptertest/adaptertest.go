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
// 422 idempotency_key_reused; 400 for a missing or invalid key; submit
// tokens; the repeat-submit window; a 5xx and a panic free the key; a
// handler that writes nothing; streamed and large answers; a storm of 200
// same-key requests runs the handler once.
package adaptertest

import (
	"bytes"
	"context"
	"encoding/json"
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
	// The adapter's Principal hook returns the request's "X-User" header
	// ("" when it is absent).
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
//	         "call":true} (the body it read, and whether its context has the
//	         Call)
//	/slow    as /ok, once the test releases it
//	/fail    500 on its first run, then as /ok
//	/panic   panics on its first run, then as /ok
//	/empty   writes nothing
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
}

func newApp() *app {
	return &app{effects: map[string]int{}, release: make(chan struct{}), started: make(chan struct{}, 1000)}
}

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
	_, call := idempotency.FromContext(r.Context())
	out, _ := json.Marshal(map[string]any{"run": run, "user": r.Header.Get("X-User"), "body": string(body), "call": call})
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
	uniq := func(t *testing.T, k string) string { return fmt.Sprintf("%s-%d", k, time.Now().UnixNano()) }

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
		// CompleteTx, Forget and MarkCompleted need).
		var seen struct {
			Body string `json:"body"`
			Call bool   `json:"call"`
		}
		if err := json.Unmarshal(first.body, &seen); err != nil || seen.Body != `{"amount":1}` || !seen.Call {
			t.Errorf("the handler read body %q, Call in its context %v (%v); want the request's body and the Call", seen.Body, seen.Call, err)
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
		if got := c.send("/ok", "ann", "", "", `{}`); got.status != 400 || got.code() != "idempotency_key_missing" {
			t.Errorf("no key: %v; want 400 idempotency_key_missing", got)
		}
		for _, k := range []string{"has space", strings.Repeat("k", 256), "\"unterminated"} {
			if got := c.send("/ok", "ann", k, "", `{}`); got.status != 400 || got.code() != "idempotency_key_invalid" {
				t.Errorf("key %q: %v; want 400 idempotency_key_invalid", k, got)
			}
		}
		if got := c.send("/ok", "ann", uniq(t, "k"), "", `{"amount":`); got.status != 400 || got.code() != "invalid_json" {
			t.Errorf("broken JSON: %v; want 400 invalid_json", got)
		}
		if a.runs.Load() != 0 {
			t.Errorf("%d runs; want 0", a.runs.Load())
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
