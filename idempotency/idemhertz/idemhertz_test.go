package idemhertz_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cloudwego/hertz/pkg/app"
	"github.com/cloudwego/hertz/pkg/app/middlewares/server/recovery"
	"github.com/cloudwego/hertz/pkg/app/server"
	"github.com/cloudwego/hertz/pkg/common/adaptor"
	"github.com/cloudwego/hertz/pkg/common/hlog"
	"github.com/cloudwego/hertz/pkg/common/test/mock"
	"github.com/cloudwego/hertz/pkg/protocol/http1/resp"

	"github.com/onceguard/onceguard/idempotency"
	"github.com/onceguard/onceguard/idempotency/idemhertz"
	"github.com/onceguard/onceguard/idempotency/idemstore"
	"github.com/onceguard/onceguard/idempotency/memstore"
)

func TestMain(m *testing.M) {
	hlog.SetLevel(hlog.LevelWarn) // no start and shutdown lines for every test server
	m.Run()
}

// start serves a hertz server on a loopback port, set up by routes, and
// returns its base URL.
func start(t *testing.T, routes func(h *server.Hertz)) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	h := server.New(server.WithListener(ln), server.WithDisablePrintRoute(true), server.WithExitWaitTime(100*time.Millisecond))
	routes(h)
	done := make(chan struct{})
	go func() { defer close(done); _ = h.Run() }()
	t.Cleanup(func() { _ = h.Shutdown(context.Background()); <-done })
	return "http://" + ln.Addr().String()
}

// guarded serves handler behind hertz's recovery and the adapter for
// every path.
func guarded(t *testing.T, o idempotency.Options[*app.RequestContext], handler app.HandlerFunc) string {
	if o.Store == nil {
		o.Store = &memstore.Store{}
	}
	return start(t, func(h *server.Hertz) {
		h.Use(recovery.Recovery(), idemhertz.New(o))
		h.Any("/*path", handler)
	})
}

type answer struct {
	status int
	header http.Header
	body   string
}

func send(t *testing.T, method, url, key, body string, hdr ...string) answer {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return answer{resp.StatusCode, resp.Header, string(b)}
}

func problemCode(t *testing.T, a answer) string {
	t.Helper()
	if ct := a.header.Get("Content-Type"); ct != "application/problem+json" {
		t.Fatalf("problem Content-Type %q (status %d, body %q)", ct, a.status, a.body)
	}
	var p struct{ Code string }
	if err := json.Unmarshal([]byte(a.body), &p); err != nil {
		t.Fatalf("problem body %q: %v", a.body, err)
	}
	return p.Code
}

const key = "8e03978e-40d5-43e8-bc93-6894a57f9324"

// A retry gets the first answer byte for byte, with its Content-Type,
// Location and Idempotent-Replayed: true, without Set-Cookie; the
// handler ran once; the handler found its Call in its ctx.
func TestReplay(t *testing.T) {
	var runs atomic.Int32
	var sawCall atomic.Bool
	url := guarded(t, idempotency.Options[*app.RequestContext]{MarkFirst: true, ExpiryHeader: true}, func(ctx context.Context, c *app.RequestContext) {
		n := runs.Add(1)
		if call, ok := idempotency.FromContext(ctx); ok && call.Key == key {
			sawCall.Store(true)
		}
		c.Header("Location", "/payments/1")
		c.Response.Header.Set("Set-Cookie", "s=secret")
		c.Data(201, "application/vnd.pay+json", []byte(fmt.Sprintf(`{"payment":%d}`, n)))
	})
	first := send(t, "POST", url+"/payments", key, `{"amount":"10.00"}`)
	again := send(t, "POST", url+"/payments", key, `{ "amount" : "10.00" }`)
	if first.status != 201 || first.body != `{"payment":1}` || first.header.Get("Idempotent-Replayed") != "false" ||
		first.header.Get("Cache-Control") != "no-store" || first.header.Get("Set-Cookie") == "" {
		t.Fatalf("first: %+v", first)
	}
	if again.status != 201 || again.body != first.body || again.header.Get("Idempotent-Replayed") != "true" ||
		again.header.Get("Content-Type") != "application/vnd.pay+json" || again.header.Get("Location") != "/payments/1" ||
		again.header.Get("Set-Cookie") != "" || again.header.Get("Cache-Control") != "no-store" {
		t.Fatalf("replay: %+v", again)
	}
	exp, err := http.ParseTime(first.header.Get("Idempotency-Key-Expires"))
	if err != nil || time.Until(exp) < 23*time.Hour || again.header.Get("Idempotency-Key-Expires") != first.header.Get("Idempotency-Key-Expires") {
		t.Fatalf("Idempotency-Key-Expires: first %q, replay %q; want the same date, a day ahead",
			first.header.Get("Idempotency-Key-Expires"), again.header.Get("Idempotency-Key-Expires"))
	}
	if runs.Load() != 1 || !sawCall.Load() {
		t.Fatalf("runs %d, saw its call %v", runs.Load(), sawCall.Load())
	}
	if other := send(t, "POST", url+"/refunds", key, `{"amount":"10.00"}`); other.body != `{"payment":2}` {
		t.Fatalf("other path: %+v", other)
	}
}

// 409 while the first is in flight, 422 for another body, 400 for a
// missing or invalid key or bad JSON, each as problem+json, and the
// handler is not run for any of them.
func TestRefusals(t *testing.T) {
	var runs atomic.Int32
	entered, release := make(chan struct{}), make(chan struct{})
	url := guarded(t, idempotency.Options[*app.RequestContext]{}, func(ctx context.Context, c *app.RequestContext) {
		if runs.Add(1) == 1 {
			close(entered)
			<-release
		}
		c.String(200, "ok")
	})
	firstDone := make(chan answer)
	go func() { firstDone <- send(t, "POST", url+"/p", key, `{"a":1}`) }()
	<-entered
	if a := send(t, "POST", url+"/p", key, `{"a":1}`); a.status != 409 || problemCode(t, a) != "request_in_progress" || a.header.Get("Retry-After") != "1" {
		t.Fatalf("in flight: %+v", a)
	}
	close(release)
	if a := <-firstDone; a.status != 200 || a.body != "ok" {
		t.Fatalf("first: %+v", a)
	}
	if a := send(t, "POST", url+"/p", key, `{"a":2}`); a.status != 422 || problemCode(t, a) != "idempotency_key_reused" {
		t.Fatalf("mismatch: %+v", a)
	}
	if a := send(t, "POST", url+"/p", "", `{"a":1}`); a.status != 400 || problemCode(t, a) != "idempotency_key_missing" {
		t.Fatalf("missing: %+v", a)
	}
	if a := send(t, "POST", url+"/p", "bad key", `{"a":1}`); a.status != 400 || problemCode(t, a) != "idempotency_key_invalid" {
		t.Fatalf("invalid: %+v", a)
	}
	if a := send(t, "POST", url+"/p", "k2", `{"a":`); a.status != 400 || problemCode(t, a) != "invalid_json" {
		t.Fatalf("bad JSON: %+v", a)
	}
	if runs.Load() != 1 {
		t.Fatalf("runs %d", runs.Load())
	}
}

// A 5xx frees the key; a 4xx is stored and replayed.
func TestStatuses(t *testing.T) {
	var runs atomic.Int32
	url := guarded(t, idempotency.Options[*app.RequestContext]{}, func(ctx context.Context, c *app.RequestContext) {
		n := runs.Add(1)
		if string(c.Path()) == "/fail" {
			c.String(500, "run %d failed", n)
			return
		}
		c.JSON(402, map[string]any{"error": "no funds", "run": n})
	})
	first := send(t, "POST", url+"/refuse", key, `{}`)
	again := send(t, "POST", url+"/refuse", key, `{}`)
	if first.status != 402 || first.body != `{"error":"no funds","run":1}` || again.status != 402 || again.body != first.body ||
		again.header.Get("Idempotent-Replayed") != "true" || again.header.Get("Content-Type") != first.header.Get("Content-Type") {
		t.Fatalf("refusal: %+v then %+v", first, again)
	}
	f1 := send(t, "POST", url+"/fail", key, `{}`)
	f2 := send(t, "POST", url+"/fail", key, `{}`)
	if f1.status != 500 || f2.status != 500 || f2.header.Get("Idempotent-Replayed") != "" || f2.body != "run 3 failed" {
		t.Fatalf("5xx: %+v then %+v", f1, f2)
	}
}

// A panic frees the key: after recovery's 500, the retry runs again.
func TestPanicFreesKey(t *testing.T) {
	var runs atomic.Int32
	url := guarded(t, idempotency.Options[*app.RequestContext]{}, func(ctx context.Context, c *app.RequestContext) {
		if runs.Add(1) == 1 {
			panic("boom")
		}
		c.String(200, "second")
	})
	if a := send(t, "POST", url+"/p", key, `{}`); a.status != 500 {
		t.Fatalf("panic: %+v", a)
	}
	if a := send(t, "POST", url+"/p", key, `{}`); a.status != 200 || a.body != "second" {
		t.Fatalf("after the panic: %+v", a)
	}
	if a := send(t, "POST", url+"/p", key, `{}`); a.body != "second" || a.header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("replay: %+v", a)
	}
}

// Streamed answers are read whole, stored and replayed byte for byte: a
// net/http handler behind hertz's adaptor that flushes (it writes to the
// connection), hertz's own chunked writer, and a body stream; a stream
// that fails is 500 internal and frees the key.
func TestStream(t *testing.T) {
	var runs atomic.Int32
	big := strings.Repeat("0123456789abcdef", 16<<10) // 256 KiB
	nethttp := adaptor.HertzHandler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		w.Header().Set("Location", "/streams/1")
		w.WriteHeader(202)
		for i := 0; i < len(big); i += 4096 {
			_, _ = io.WriteString(w, big[i:i+4096])
			w.(http.Flusher).Flush()
		}
	}))
	url := guarded(t, idempotency.Options[*app.RequestContext]{}, func(ctx context.Context, c *app.RequestContext) {
		runs.Add(1)
		switch string(c.Path()) {
		case "/nethttp":
			nethttp(ctx, c)
		case "/chunked":
			c.SetContentType("text/plain")
			c.Response.HijackWriter(resp.NewChunkedBodyWriter(&c.Response, c.GetWriter()))
			for i := 0; i < len(big); i += 4096 {
				_, _ = c.Write([]byte(big[i : i+4096]))
				_ = c.Flush()
			}
		case "/bodystream":
			c.SetContentType("text/plain")
			c.SetBodyStream(strings.NewReader(big), -1)
		case "/broken":
			c.SetBodyStream(io.MultiReader(strings.NewReader("part"), errReader{}), -1)
		}
	})
	for i, path := range []string{"/nethttp", "/chunked", "/bodystream"} {
		first := send(t, "POST", url+path, key, `{}`)
		again := send(t, "POST", url+path, key, `{}`)
		if first.body != big || again.body != big || again.status != first.status || again.header.Get("Content-Type") != first.header.Get("Content-Type") ||
			again.header.Get("Idempotent-Replayed") != "true" || int(runs.Load()) != i+1 {
			t.Fatalf("%s: %d %d bytes %v; replay %d %d bytes %v; runs %d", path, first.status, len(first.body), first.header,
				again.status, len(again.body), again.header, runs.Load())
		}
		if path == "/nethttp" && (first.status != 202 || again.header.Get("Location") != "/streams/1") {
			t.Fatalf("net/http stream: %d, %v", first.status, again.header)
		}
	}
	if a := send(t, "POST", url+"/broken", key, `{}`); a.status != 500 || problemCode(t, a) != "internal" {
		t.Fatalf("broken stream: %+v", a)
	}
	if a := send(t, "POST", url+"/broken", key, `{}`); a.status != 500 || runs.Load() != 5 {
		t.Fatalf("broken stream again: %+v, runs %d (the key was not freed)", a, runs.Load())
	}
}

type errReader struct{}

func (errReader) Read([]byte) (int, error) { return 0, errors.New("disk gone") }

// No key on a KeyOptional route: the handler runs, unprotected, each
// time; a key there is still checked.
func TestKeyOptional(t *testing.T) {
	var runs atomic.Int32
	var (
		mu     sync.Mutex // OnEvent runs on the server's goroutines
		events []string
	)
	o := idempotency.Options[*app.RequestContext]{KeyOptional: true, OnEvent: func(_ *app.RequestContext, ev string) {
		mu.Lock()
		defer mu.Unlock()
		events = append(events, ev)
	}}
	url := guarded(t, o, func(ctx context.Context, c *app.RequestContext) {
		_, keyed := idempotency.FromContext(ctx)
		c.String(200, "run %d keyed=%v", runs.Add(1), keyed)
	})
	a := send(t, "POST", url+"/p", "", `{}`)
	b := send(t, "POST", url+"/p", "", `{}`)
	if a.body != "run 1 keyed=false" || b.body != "run 2 keyed=false" || b.header.Get("Idempotent-Replayed") != "" {
		t.Fatalf("unprotected: %+v, %+v", a, b)
	}
	if c := send(t, "POST", url+"/p", "bad key", `{}`); c.status != 400 {
		t.Fatalf("invalid key on an optional route: %+v", c)
	}
	mu.Lock()
	defer mu.Unlock()
	if got := strings.Join(events, ","); got != "unprotected,unprotected,key_invalid" {
		t.Fatalf("events %s", got)
	}
}

// A problem after the handler ran (a refusal that could not be stored)
// carries none of the handler's headers, but keeps those set in front.
func TestProblemAfterHandler(t *testing.T) {
	store := &failingStore{Store: &memstore.Store{}}
	url := start(t, func(h *server.Hertz) {
		h.Use(func(ctx context.Context, c *app.RequestContext) {
			c.Header("Access-Control-Allow-Origin", "*")
			c.Next(ctx)
		})
		h.Use(idemhertz.New(idempotency.Options[*app.RequestContext]{Store: store}))
		h.POST("/p", func(ctx context.Context, c *app.RequestContext) {
			c.Response.Header.Set("Set-Cookie", "s=secret")
			c.Header("X-Handler", "1")
			c.String(409, "conflict")
		})
	})
	a := send(t, "POST", url+"/p", key, `{}`)
	if a.status != 503 || problemCode(t, a) != "store_unavailable" || a.header.Get("Set-Cookie") != "" ||
		a.header.Get("X-Handler") != "" || a.header.Get("Access-Control-Allow-Origin") != "*" {
		t.Fatalf("%+v", a)
	}
}

// failingStore cannot complete a record.
type failingStore struct{ *memstore.Store }

func (s *failingStore) Complete(context.Context, string, string, idemstore.Response, time.Time) error {
	return errors.New("store down")
}

// A handler that writes nothing: its empty 200 is stored, and the replay
// has the same (absent) Content-Type.
func TestWritesNothing(t *testing.T) {
	var runs atomic.Int32
	url := guarded(t, idempotency.Options[*app.RequestContext]{}, func(ctx context.Context, c *app.RequestContext) { runs.Add(1) })
	first := send(t, "POST", url+"/p", key, `{}`)
	again := send(t, "POST", url+"/p", key, `{}`)
	if first.status != 200 || first.body != "" || again.status != 200 || again.body != "" ||
		again.header.Get("Content-Type") != first.header.Get("Content-Type") || again.header.Get("Idempotent-Replayed") != "true" || runs.Load() != 1 {
		t.Fatalf("%+v then %+v, runs %d", first, again, runs.Load())
	}
}

// While the chain runs the connection is captured, but a TLS connection
// still shows its state: a net/http handler behind hertz's adaptor sees
// r.TLS.
func TestCaptureKeepsTLS(t *testing.T) {
	var sawTLS atomic.Bool
	h := server.New()
	h.Use(idemhertz.New(idempotency.Options[*app.RequestContext]{Store: &memstore.Store{}}))
	h.POST("/p", adaptor.HertzHandler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		sawTLS.Store(r.TLS != nil)
		_, _ = io.WriteString(w, "ok")
	})))
	c := h.Engine.NewContext()
	c.SetConn(mock.NewTLSConn(mock.NewConn("")))
	c.Request.Header.SetMethod("POST")
	c.Request.SetRequestURI("/p")
	c.Request.Header.Set("Idempotency-Key", key)
	c.Request.SetBodyString(`{}`)
	h.Engine.ServeHTTP(context.Background(), c)
	if c.Response.StatusCode() != 200 || string(c.Response.Body()) != "ok" || !sawTLS.Load() {
		t.Fatalf("%d %q, r.TLS set: %v", c.Response.StatusCode(), c.Response.Body(), sawTLS.Load())
	}
}

// Options.KeyField: the key in a form field when there is no header.
func TestKeyField(t *testing.T) {
	var runs atomic.Int32
	url := guarded(t, idempotency.Options[*app.RequestContext]{KeyField: "withdraw_token", Fingerprint: formFingerprint[*app.RequestContext]}, func(ctx context.Context, c *app.RequestContext) {
		runs.Add(1)
		c.String(200, "paid %s", c.PostForm("amount"))
	})
	form := "withdraw_token=wt-1&amount=5"
	first := send(t, "POST", url+"/w", "", form, "Content-Type", "application/x-www-form-urlencoded")
	again := send(t, "POST", url+"/w", "", form, "Content-Type", "application/x-www-form-urlencoded")
	if first.status != 200 || first.body != "paid 5" || again.body != "paid 5" || again.header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("%+v then %+v", first, again)
	}
	if a := send(t, "POST", url+"/w", "", "amount=5", "Content-Type", "application/x-www-form-urlencoded"); a.status != 400 || problemCode(t, a) != "idempotency_key_missing" {
		t.Fatalf("no field: %+v", a)
	}
	if runs.Load() != 1 {
		t.Fatalf("runs %d", runs.Load())
	}
}

// formFingerprint fingerprints a form body by its bytes.
func formFingerprint[R any](_ R, body []byte) (string, error) {
	sum := sha256.Sum256(body)
	return hex.EncodeToString(sum[:]), nil
}

// ReplayHeaders "*": every header of the first answer is replayed but
// Set-Cookie, Date, Content-Length and the hop-by-hop ones, each once.
func TestReplayAllHeaders(t *testing.T) {
	url := guarded(t, idempotency.Options[*app.RequestContext]{ReplayHeaders: []string{"*"}}, func(ctx context.Context, c *app.RequestContext) {
		c.Header("X-Request-Cost", "3")
		c.Response.Header.Add("Vary", "Accept")
		c.Response.Header.Add("Vary", "Origin")
		c.Response.Header.Set("Set-Cookie", "s=secret")
		c.JSON(201, map[string]bool{"ok": true})
	})
	first := send(t, "POST", url+"/p", key, `{}`)
	again := send(t, "POST", url+"/p", key, `{}`)
	if again.body != first.body || again.header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("%+v then %+v", first, again)
	}
	for k, v := range first.header {
		switch k {
		case "Date", "Content-Length":
			continue
		case "Set-Cookie":
			if again.header[k] != nil {
				t.Errorf("replayed Set-Cookie %q", again.header[k])
			}
			continue
		}
		if fmt.Sprint(again.header[k]) != fmt.Sprint(v) {
			t.Errorf("header %s: first %q, replay %q", k, v, again.header[k])
		}
	}
}

// watchedStore tells when a Begin found its key in flight.
type watchedStore struct {
	*memstore.Store
	inFlight chan struct{}
}

func (s *watchedStore) Begin(ctx context.Context, r idemstore.BeginRequest) (idemstore.BeginResult, error) {
	res, err := s.Store.Begin(ctx, r)
	if err == nil && res.Outcome == idemstore.InProgress {
		select {
		case s.inFlight <- struct{}{}:
		default:
		}
	}
	return res, err
}

// Options.Wait: a retry that arrives while the first is in flight waits
// for its answer and replays it, instead of a 409.
func TestWait(t *testing.T) {
	store := &watchedStore{Store: &memstore.Store{}, inFlight: make(chan struct{}, 1)}
	var runs atomic.Int32
	release, entered := make(chan struct{}), make(chan struct{}, 1)
	url := guarded(t, idempotency.Options[*app.RequestContext]{Store: store, Wait: time.Minute}, func(ctx context.Context, c *app.RequestContext) {
		runs.Add(1)
		entered <- struct{}{}
		<-release
		c.String(201, "done")
	})
	first := make(chan answer, 1)
	go func() { first <- send(t, "POST", url+"/p", key, `{}`) }()
	<-entered // the first is in its handler
	second := make(chan answer, 1)
	go func() { second <- send(t, "POST", url+"/p", key, `{}`) }()
	<-store.inFlight // the retry found the key in flight: it waits
	close(release)
	f, s := <-first, <-second
	if f.status != 201 || s.status != 201 || s.body != "done" || s.header.Get("Idempotent-Replayed") != "true" || runs.Load() != 1 {
		t.Fatalf("first %+v, waiting retry %+v, runs %d", f, s, runs.Load())
	}
}
