package idemfiber_test

import (
	"bufio"
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

	"github.com/gofiber/fiber/v2"
	"github.com/gofiber/fiber/v2/middleware/recover"

	"github.com/onceguard/onceguard/idempotency"
	"github.com/onceguard/onceguard/idempotency/idemfiber"
	"github.com/onceguard/onceguard/idempotency/idemstore"
	"github.com/onceguard/onceguard/idempotency/memstore"
)

// start serves app on a loopback port and returns its base URL.
func start(t *testing.T, app *fiber.App) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { defer close(done); _ = app.Listener(ln) }()
	t.Cleanup(func() { _ = app.Shutdown(); <-done })
	return "http://" + ln.Addr().String()
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

func newApp(o idempotency.Options[*fiber.Ctx], h fiber.Handler) *fiber.App {
	if o.Store == nil {
		o.Store = &memstore.Store{}
	}
	app := fiber.New(fiber.Config{DisableStartupMessage: true})
	app.Use(recover.New())
	app.Use(idemfiber.New(o))
	app.All("/*", h)
	return app
}

// A retry gets the first answer byte for byte, with its Content-Type,
// Location and Idempotent-Replayed: true, without Set-Cookie; the
// handler ran once; the handler found its Call in c.UserContext().
func TestReplay(t *testing.T) {
	var runs atomic.Int32
	var sawCall atomic.Bool
	url := start(t, newApp(idempotency.Options[*fiber.Ctx]{MarkFirst: true, ExpiryHeader: true}, func(c *fiber.Ctx) error {
		n := runs.Add(1)
		if call, ok := idempotency.FromContext(c.UserContext()); ok && call.Key == key {
			sawCall.Store(true)
		}
		c.Set("Location", "/payments/1")
		c.Cookie(&fiber.Cookie{Name: "s", Value: "secret"})
		c.Set("Content-Type", "application/vnd.pay+json")
		return c.Status(201).SendString(fmt.Sprintf(`{"payment":%d}`, n))
	}))
	first := send(t, "POST", url+"/payments", key, `{"amount":"10.00"}`)
	again := send(t, "POST", url+"/payments", key, `{ "amount" : "10.00" }`) // the same JSON
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
	// Another path is another scope: it runs.
	if other := send(t, "POST", url+"/refunds", key, `{"amount":"10.00"}`); other.body != `{"payment":2}` {
		t.Fatalf("other path: %+v", other)
	}
}

// 409 while the first is in flight, 422 for another body, 400 for a
// missing or invalid key, each as problem+json, and the handler is not
// run for any of them.
func TestRefusals(t *testing.T) {
	var runs atomic.Int32
	entered, release := make(chan struct{}), make(chan struct{})
	url := start(t, newApp(idempotency.Options[*fiber.Ctx]{}, func(c *fiber.Ctx) error {
		if runs.Add(1) == 1 {
			close(entered)
			<-release
		}
		return c.SendString("ok")
	}))
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

// A handler that returns an error: the app's ErrorHandler's answer is
// what is stored and replayed (a 4xx), and a 5xx frees the key.
func TestReturnedError(t *testing.T) {
	var runs atomic.Int32
	app := fiber.New(fiber.Config{DisableStartupMessage: true, ErrorHandler: func(c *fiber.Ctx, err error) error {
		code := 500
		var fe *fiber.Error
		if errors.As(err, &fe) {
			code = fe.Code
		}
		return c.Status(code).JSON(fiber.Map{"error": err.Error(), "run": runs.Load()})
	}})
	app.Use(idemfiber.New(idempotency.Options[*fiber.Ctx]{Store: &memstore.Store{}}))
	app.Post("/refuse", func(c *fiber.Ctx) error {
		runs.Add(1)
		return fiber.NewError(402, "no funds")
	})
	app.Post("/fail", func(c *fiber.Ctx) error {
		runs.Add(1)
		return errors.New("db down")
	})
	url := start(t, app)

	first := send(t, "POST", url+"/refuse", key, `{}`)
	again := send(t, "POST", url+"/refuse", key, `{}`)
	if first.status != 402 || first.body != `{"error":"no funds","run":1}` || again.status != 402 || again.body != first.body ||
		again.header.Get("Idempotent-Replayed") != "true" || again.header.Get("Content-Type") != first.header.Get("Content-Type") {
		t.Fatalf("refusal: %+v then %+v", first, again)
	}
	f1 := send(t, "POST", url+"/fail", key, `{}`)
	f2 := send(t, "POST", url+"/fail", key, `{}`)
	if f1.status != 500 || f2.status != 500 || f2.header.Get("Idempotent-Replayed") != "" || f2.body != `{"error":"db down","run":3}` {
		t.Fatalf("5xx: %+v then %+v", f1, f2)
	}
	if runs.Load() != 3 {
		t.Fatalf("runs %d, want 3 (one refusal, two failures)", runs.Load())
	}
}

// A panic frees the key: after recover's 500, the retry runs again.
func TestPanicFreesKey(t *testing.T) {
	var runs atomic.Int32
	url := start(t, newApp(idempotency.Options[*fiber.Ctx]{}, func(c *fiber.Ctx) error {
		if runs.Add(1) == 1 {
			panic("boom")
		}
		return c.SendString("second")
	}))
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

// A streamed answer is read whole, stored, and replayed byte for byte; a
// stream that fails is 500 internal and frees the key.
func TestStream(t *testing.T) {
	var runs atomic.Int32
	big := strings.Repeat("0123456789abcdef", 16<<10) // 256 KiB
	app := newApp(idempotency.Options[*fiber.Ctx]{}, func(c *fiber.Ctx) error {
		runs.Add(1)
		if c.Path() == "/broken" {
			c.Context().SetBodyStream(io.MultiReader(strings.NewReader("part"), errReader{}), -1)
			return nil
		}
		c.Set("Content-Type", "text/event-stream")
		c.Context().SetBodyStreamWriter(func(w *bufio.Writer) {
			for i := 0; i < len(big); i += 4096 {
				_, _ = w.WriteString(big[i : i+4096])
				_ = w.Flush()
			}
		})
		return nil
	})
	url := start(t, app)
	first := send(t, "POST", url+"/s", key, `{}`)
	again := send(t, "POST", url+"/s", key, `{}`)
	if first.status != 200 || first.body != big || again.body != big || again.header.Get("Content-Type") != "text/event-stream" ||
		again.header.Get("Idempotent-Replayed") != "true" || runs.Load() != 1 {
		t.Fatalf("stream: %d %d bytes, replay %d bytes %v, runs %d", first.status, len(first.body), len(again.body), again.header, runs.Load())
	}
	if a := send(t, "POST", url+"/broken", key, `{}`); a.status != 500 || problemCode(t, a) != "internal" {
		t.Fatalf("broken stream: %+v", a)
	}
	if a := send(t, "POST", url+"/broken", key, `{}`); a.status != 500 || runs.Load() != 3 {
		t.Fatalf("broken stream again: %+v, runs %d (the key was not freed)", a, runs.Load())
	}
}

type errReader struct{}

func (errReader) Read([]byte) (int, error) { return 0, errors.New("disk gone") }

// No key on a KeyOptional route: the handler runs, unprotected, each
// time, without the replay headers; a key there is still checked.
func TestKeyOptional(t *testing.T) {
	var runs atomic.Int32
	var (
		mu     sync.Mutex // OnEvent runs on the server's goroutines
		events []string
	)
	o := idempotency.Options[*fiber.Ctx]{KeyOptional: true, OnEvent: func(_ *fiber.Ctx, ev string) {
		mu.Lock()
		defer mu.Unlock()
		events = append(events, ev)
	}}
	url := start(t, newApp(o, func(c *fiber.Ctx) error {
		_, keyed := idempotency.FromContext(c.UserContext())
		return c.SendString(fmt.Sprintf("run %d keyed=%v", runs.Add(1), keyed))
	}))
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
	app := fiber.New(fiber.Config{DisableStartupMessage: true})
	app.Use(func(c *fiber.Ctx) error { c.Set("Access-Control-Allow-Origin", "*"); return c.Next() })
	app.Use(idemfiber.New(idempotency.Options[*fiber.Ctx]{Store: store}))
	app.Post("/p", func(c *fiber.Ctx) error {
		c.Cookie(&fiber.Cookie{Name: "s", Value: "secret"})
		c.Set("X-Handler", "1")
		return c.Status(409).SendString("conflict")
	})
	url := start(t, app)
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
	url := start(t, newApp(idempotency.Options[*fiber.Ctx]{}, func(c *fiber.Ctx) error { runs.Add(1); return nil }))
	first := send(t, "POST", url+"/p", key, `{}`)
	again := send(t, "POST", url+"/p", key, `{}`)
	if first.status != 200 || first.body != "" || again.status != 200 || again.body != "" ||
		again.header.Get("Content-Type") != first.header.Get("Content-Type") || again.header.Get("Idempotent-Replayed") != "true" || runs.Load() != 1 {
		t.Fatalf("%+v then %+v, runs %d", first, again, runs.Load())
	}
}

// Options.KeyField: the key in a form field when there is no header.
func TestKeyField(t *testing.T) {
	var runs atomic.Int32
	url := start(t, newApp(idempotency.Options[*fiber.Ctx]{KeyField: "withdraw_token", Fingerprint: formFingerprint[*fiber.Ctx]}, func(c *fiber.Ctx) error {
		runs.Add(1)
		return c.SendString("paid " + c.FormValue("amount"))
	}))
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
	url := start(t, newApp(idempotency.Options[*fiber.Ctx]{ReplayHeaders: []string{"*"}}, func(c *fiber.Ctx) error {
		c.Set("X-Request-Cost", "3")
		c.Append("Vary", "Accept")
		c.Append("Vary", "Origin")
		c.Cookie(&fiber.Cookie{Name: "s", Value: "secret"})
		return c.Status(201).JSON(fiber.Map{"ok": true})
	}))
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

// A mounted app's own ErrorHandler answers its routes' errors, and that
// answer is what is stored and replayed.
func TestMountedErrorHandler(t *testing.T) {
	var runs atomic.Int32
	sub := fiber.New(fiber.Config{ErrorHandler: func(c *fiber.Ctx, err error) error {
		return c.Status(409).SendString("sub: " + err.Error())
	}})
	sub.Post("/x", func(c *fiber.Ctx) error {
		runs.Add(1)
		return errors.New("taken")
	})
	app := fiber.New(fiber.Config{DisableStartupMessage: true})
	app.Use(idemfiber.New(idempotency.Options[*fiber.Ctx]{Store: &memstore.Store{}}))
	app.Mount("/api", sub)
	url := start(t, app)
	first := send(t, "POST", url+"/api/x", key, `{}`)
	again := send(t, "POST", url+"/api/x", key, `{}`)
	if first.status != 409 || first.body != "sub: taken" || again.status != 409 || again.body != first.body ||
		again.header.Get("Idempotent-Replayed") != "true" || runs.Load() != 1 {
		t.Fatalf("%+v then %+v, runs %d", first, again, runs.Load())
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
	url := start(t, newApp(idempotency.Options[*fiber.Ctx]{Store: store, Wait: time.Minute}, func(c *fiber.Ctx) error {
		runs.Add(1)
		entered <- struct{}{}
		<-release
		return c.Status(201).SendString("done")
	}))
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
