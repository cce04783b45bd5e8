package gateway_test

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/onceguard/onceguard/cmd/onceguard/internal/gateway"
	"github.com/onceguard/onceguard/idempotency"
	"github.com/onceguard/onceguard/idempotency/idemstore"
	"github.com/onceguard/onceguard/idempotency/memstore"
)

// upstream is a test backend that counts what reaches it.
type upstream struct {
	srv     *httptest.Server
	mu      sync.Mutex
	calls   map[string]int // "METHOD PATH" -> requests
	last    *http.Request
	body    string
	handler func(w http.ResponseWriter, r *http.Request) // nil: 201 {"ok":true} with a cookie
}

func newUpstream(t *testing.T) *upstream {
	u := &upstream{calls: map[string]int{}}
	u.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		u.mu.Lock()
		u.calls[r.Method+" "+r.URL.Path]++
		u.last, u.body = r, string(b)
		r.Body = io.NopCloser(strings.NewReader(string(b)))
		h := u.handler
		u.mu.Unlock()
		if h != nil {
			h(w, r)
			return
		}
		w.Header().Set("Set-Cookie", "PHPSESSID=new; Path=/")
		w.Header().Set("X-Upstream", "yes")
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, `{"ok":true,"n":`+itoa(u.count(r.Method+" "+r.URL.Path))+`}`)
	}))
	t.Cleanup(u.srv.Close)
	return u
}

func itoa(n int) string { return strconv.Itoa(n) }

func (u *upstream) count(k string) int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.calls[k]
}

func (u *upstream) set(h func(w http.ResponseWriter, r *http.Request)) {
	u.mu.Lock()
	u.handler = h
	u.mu.Unlock()
}

type opt func(*gateway.Config)

// newGateway runs a gateway in front of base, on a memstore, with the
// cookie PHPSESSID as the principal.
func newGateway(t *testing.T, base string, routes []string, opts ...opt) (*httptest.Server, *gateway.Config) {
	t.Helper()
	up, err := url.Parse(base)
	if err != nil {
		t.Fatal(err)
	}
	cfg := gateway.Config{Upstream: up, Keys: &memstore.Store{}, PrincipalCookie: "PHPSESSID", UpstreamTimeout: 2 * time.Second}
	for _, s := range routes {
		r, err := gateway.ParseRoute(s)
		if err != nil {
			t.Fatal(err)
		}
		cfg.Routes = append(cfg.Routes, r)
	}
	for _, o := range opts {
		o(&cfg)
	}
	g, err := gateway.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(g)
	t.Cleanup(srv.Close)
	return srv, &cfg
}

type answer struct {
	status int
	header http.Header
	body   string
	code   string
}

func do(t *testing.T, method, u, cookie, contentType, body string, header ...string) answer {
	t.Helper()
	req, err := http.NewRequest(method, u, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if cookie != "" {
		req.AddCookie(&http.Cookie{Name: "PHPSESSID", Value: cookie})
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	a := answer{status: resp.StatusCode, header: resp.Header, body: string(b)}
	if strings.Contains(resp.Header.Get("Content-Type"), "problem+json") {
		var p struct{ Code string }
		_ = json.Unmarshal(b, &p)
		a.code = p.Code
	}
	return a
}

// The first request is forwarded once, with the key and the forwarding
// headers; a retry gets the stored answer byte for byte, replayed,
// without Set-Cookie; the upstream sees one request.
func TestForwardOnceThenReplay(t *testing.T) {
	u := newUpstream(t)
	gw, _ := newGateway(t, u.srv.URL, []string{"POST /withdraw withdrawal"})
	first := do(t, "POST", gw.URL+"/withdraw?x=1", "s1", "application/json", `{"amount":"10"}`, "Idempotency-Key", "k1", "X-Forwarded-For", "10.0.0.9")
	if first.status != 201 || first.header.Get("Set-Cookie") == "" || first.header.Get("Idempotent-Replayed") == "true" {
		t.Fatalf("first = %d %v %q; want the upstream's 201 with its Set-Cookie, not a replay", first.status, first.header, first.body)
	}
	u.mu.Lock()
	last, body := u.last, u.body
	u.mu.Unlock()
	if got := last.Header.Get("Idempotency-Key"); got != "k1" {
		t.Errorf("upstream got Idempotency-Key %q; want k1", got)
	}
	if xff := last.Header.Get("X-Forwarded-For"); xff != "10.0.0.9, 127.0.0.1" {
		t.Errorf("X-Forwarded-For = %q; want the client's appended", xff)
	}
	if last.Header.Get("X-Forwarded-Host") == "" || last.Header.Get("X-Forwarded-Proto") != "http" || last.URL.RawQuery != "x=1" || body != `{"amount":"10"}` {
		t.Errorf("upstream got host %q proto %q query %q body %q", last.Header.Get("X-Forwarded-Host"), last.Header.Get("X-Forwarded-Proto"), last.URL.RawQuery, body)
	}
	again := do(t, "POST", gw.URL+"/withdraw?x=1", "s1", "application/json", `{ "amount" : "10" }`, "Idempotency-Key", "k1")
	if again.status != 201 || again.body != first.body || again.header.Get("Idempotent-Replayed") != "true" ||
		again.header.Get("Set-Cookie") != "" || again.header.Get("X-Upstream") != "yes" {
		t.Errorf("retry = %d %v %q; want the first answer %q replayed, X-Upstream kept, no Set-Cookie", again.status, again.header, again.body, first.body)
	}
	if n := u.count("POST /withdraw"); n != 1 {
		t.Errorf("upstream saw %d requests; want 1", n)
	}
	if other := do(t, "POST", gw.URL+"/withdraw", "s1", "application/json", `{"amount":"11"}`, "Idempotency-Key", "k1"); other.status != 422 || other.code != "idempotency_key_reused" {
		t.Errorf("same key, other body = %d %q; want 422 idempotency_key_reused", other.status, other.code)
	}
	// Another session's same key is another request.
	if b := do(t, "POST", gw.URL+"/withdraw?x=1", "s2", "application/json", `{"amount":"10"}`, "Idempotency-Key", "k1"); b.status != 201 || b.header.Get("Idempotent-Replayed") == "true" {
		t.Errorf("other principal = %d %v; want forwarded", b.status, b.header)
	}
	if missing := do(t, "POST", gw.URL+"/withdraw", "", "application/json", `{}`, "Idempotency-Key", "k9"); missing.status != 401 || missing.code != "unauthenticated" {
		t.Errorf("no cookie = %d %q; want 401 unauthenticated", missing.status, missing.code)
	}
	if nokey := do(t, "POST", gw.URL+"/withdraw", "s1", "application/json", `{}`); nokey.status != 400 || nokey.code != "idempotency_key_missing" {
		t.Errorf("no key = %d %q; want 400 idempotency_key_missing", nokey.status, nokey.code)
	}
}

// A 5xx is stored and replayed like any answer: the upstream may have
// moved money before failing.
func TestServerErrorIsStored(t *testing.T) {
	u := newUpstream(t)
	u.set(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusInternalServerError)
		_, _ = io.WriteString(w, "boom")
	})
	gw, _ := newGateway(t, u.srv.URL, []string{"POST /orders/{id}/pay payment"})
	for i := range 3 {
		a := do(t, "POST", gw.URL+"/orders/7/pay", "s", "application/json", `{}`, "Idempotency-Key", "k")
		if a.status != 500 || a.body != "boom" || (i > 0) != (a.header.Get("Idempotent-Replayed") == "true") {
			t.Fatalf("try %d = %d %q replayed=%q; want 500 boom, replayed after the first", i, a.status, a.body, a.header.Get("Idempotent-Replayed"))
		}
	}
	if n := u.count("POST /orders/7/pay"); n != 1 {
		t.Errorf("upstream saw %d; want 1", n)
	}
	// {id} is part of the scope: the same key on another order is another request.
	if a := do(t, "POST", gw.URL+"/orders/8/pay", "s", "application/json", `{}`, "Idempotency-Key", "k"); a.header.Get("Idempotent-Replayed") == "true" || u.count("POST /orders/8/pay") != 1 {
		t.Errorf("other order = %v; want forwarded", a.header)
	}
}

// The key from a form field, the form's fingerprint without it: two
// tokens with one body are one intent inside the window.
func TestKeyFieldAndWindow(t *testing.T) {
	u := newUpstream(t)
	gw, _ := newGateway(t, u.srv.URL, []string{"POST /withdraw.php withdrawal"}, func(c *gateway.Config) {
		c.KeyField, c.Window, c.RequireToken = "withdraw_token", time.Minute, map[string]bool{"withdrawal": true}
	})
	tok := func() string {
		a := do(t, "POST", gw.URL+"/onceguard/v1/submit-tokens", "s", "application/json", `{"purpose":"withdrawal"}`)
		var v struct{ Token, Purpose, ExpiresAt string }
		if a.status != 201 || json.Unmarshal([]byte(a.body), &v) != nil || !strings.HasPrefix(v.Token, "st_") || v.Purpose != "withdrawal" {
			t.Fatalf("submit token = %d %q; want 201 with an st_ token", a.status, a.body)
		}
		return v.Token
	}
	const form = "application/x-www-form-urlencoded"
	t1, t2 := tok(), tok()
	if a := do(t, "POST", gw.URL+"/withdraw.php", "s", form, "amount=10&withdraw_token="+t1+"&note=x"); a.status != 201 {
		t.Fatalf("first = %d %q; want 201", a.status, a.body)
	}
	if got := u.last.Header.Get("Idempotency-Key"); got != t1 {
		t.Errorf("upstream's Idempotency-Key = %q; want the form's token", got)
	}
	// Same fields, another order, another token: the same intent.
	if a := do(t, "POST", gw.URL+"/withdraw.php", "s", form, "note=x&withdraw_token="+t2+"&amount=10"); a.status != 429 || a.code != "duplicate_submission" || a.header.Get("Retry-After") == "" {
		t.Errorf("second token, same form = %d %q %v; want 429 duplicate_submission with Retry-After", a.status, a.code, a.header)
	}
	if a := do(t, "POST", gw.URL+"/withdraw.php", "s", form, "note=x&withdraw_token="+t1+"&amount=10"); a.status != 201 || a.header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("first token again = %d %v; want the replay", a.status, a.header)
	}
	if a := do(t, "POST", gw.URL+"/withdraw.php", "s", form, "amount=10&withdraw_token=plain-key"); a.status != 400 || a.code != "submit_token_required" {
		t.Errorf("plain key = %d %q; want 400 submit_token_required", a.status, a.code)
	}
	if a := do(t, "POST", gw.URL+"/withdraw.php", "other", form, "amount=10&withdraw_token="+t2); a.status != 400 || a.code != "submit_token_invalid" {
		t.Errorf("another session's token = %d %q; want 400 submit_token_invalid", a.status, a.code)
	}
	if n := u.count("POST /withdraw.php"); n != 1 {
		t.Errorf("upstream saw %d; want 1", n)
	}
	if a := do(t, "POST", gw.URL+"/onceguard/v1/submit-tokens", "s", "application/json", `{"purpose":"deposit"}`); a.status != 400 || a.code != "invalid_purpose" {
		t.Errorf("unknown purpose = %d %q; want 400 invalid_purpose", a.status, a.code)
	}
	if a := do(t, "POST", gw.URL+"/onceguard/v1/submit-tokens", "", "application/json", `{"purpose":"withdrawal"}`); a.status != 401 {
		t.Errorf("token without a session = %d; want 401", a.status)
	}
}

// JSON bodies: the key from a top-level member, the header winning.
func TestKeyFieldJSON(t *testing.T) {
	u := newUpstream(t)
	gw, _ := newGateway(t, u.srv.URL, []string{"POST /pay"}, func(c *gateway.Config) { c.KeyField = "token" })
	if a := do(t, "POST", gw.URL+"/pay", "s", "application/json", `{"amount":5,"token":"abc"}`); a.status != 201 || u.last.Header.Get("Idempotency-Key") != "abc" {
		t.Fatalf("= %d, key %q; want 201 under abc", a.status, u.last.Header.Get("Idempotency-Key"))
	}
	if a := do(t, "POST", gw.URL+"/pay", "s", "application/json", `{"token":"abc", "amount":5}`); a.header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("members reordered = %d %v; want the replay", a.status, a.header)
	}
	if a := do(t, "POST", gw.URL+"/pay", "s", "application/json", `{"token":"abc","amount":5}`, "Idempotency-Key", "hdr"); a.header.Get("Idempotent-Replayed") == "true" || u.last.Header.Get("Idempotency-Key") != "hdr" {
		t.Errorf("header and field = replayed %q, key %q; want the header's key, forwarded", a.header.Get("Idempotent-Replayed"), u.last.Header.Get("Idempotency-Key"))
	}
	if a := do(t, "POST", gw.URL+"/pay", "s", "application/json", `{"token":"x","token":"y"}`); a.status != 400 {
		t.Errorf("member twice = %d; want 400", a.status)
	}
}

// The upstream times out after the request was sent: 502
// upstream_outcome_unknown, stored; the key is never forwarded again.
func TestTimeoutIsUnknownForever(t *testing.T) {
	u := newUpstream(t)
	release := make(chan struct{})
	u.set(func(w http.ResponseWriter, r *http.Request) { <-release })
	t.Cleanup(func() { close(release) })
	gw, _ := newGateway(t, u.srv.URL, []string{"POST /withdraw"}, func(c *gateway.Config) { c.UpstreamTimeout = 300 * time.Millisecond })
	for i := range 3 {
		a := do(t, "POST", gw.URL+"/withdraw", "s", "application/json", `{"amount":1}`, "Idempotency-Key", "slow")
		if a.status != 502 || a.code != "upstream_outcome_unknown" || (i > 0) != (a.header.Get("Idempotent-Replayed") == "true") {
			t.Fatalf("try %d = %d %q replayed=%q; want 502 upstream_outcome_unknown, stored", i, a.status, a.code, a.header.Get("Idempotent-Replayed"))
		}
	}
	if n := u.count("POST /withdraw"); n != 1 {
		t.Errorf("upstream saw %d; want 1", n)
	}
}

// The upstream's connection breaks after it read the request, on a
// kept-alive connection: outcome unknown, and net/http's Transport does
// not re-send it on a fresh connection.
func TestBrokenConnectionIsUnknown(t *testing.T) {
	u := newUpstream(t)
	gw, _ := newGateway(t, u.srv.URL, []string{"POST /withdraw"})
	if a := do(t, "POST", gw.URL+"/withdraw", "s", "application/json", `{"amount":1}`, "Idempotency-Key", "warm"); a.status != 201 {
		t.Fatalf("warm-up = %d", a.status)
	}
	u.set(func(w http.ResponseWriter, r *http.Request) {
		c, _, err := http.NewResponseController(w).Hijack()
		if err == nil {
			_ = c.Close() // the request was read, and acted on, then the process died
		}
	})
	a := do(t, "POST", gw.URL+"/withdraw", "s", "application/json", `{"amount":2}`, "Idempotency-Key", "dies")
	if a.status != 502 || a.code != "upstream_outcome_unknown" {
		t.Fatalf("= %d %q; want 502 upstream_outcome_unknown", a.status, a.code)
	}
	u.set(nil)
	if b := do(t, "POST", gw.URL+"/withdraw", "s", "application/json", `{"amount":2}`, "Idempotency-Key", "dies"); b.code != "upstream_outcome_unknown" || b.header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("retry = %d %q; want the unknown outcome replayed", b.status, b.code)
	}
	if n := u.count("POST /withdraw"); n != 2 { // warm-up and the one that died
		t.Errorf("upstream saw %d; want 2 (no re-send)", n)
	}
}

// The upstream is down before anything is sent: 502 upstream_unavailable,
// nothing stored; the same key runs once when it is back.
func TestUnavailableFreesTheKey(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	gw, _ := newGateway(t, "http://"+addr, []string{"POST /withdraw"})
	a := do(t, "POST", gw.URL+"/withdraw", "s", "application/json", `{"amount":1}`, "Idempotency-Key", "k")
	if a.status != 502 || a.code != "upstream_unavailable" || a.header.Get("Idempotent-Replayed") != "" {
		t.Fatalf("down = %d %q; want 502 upstream_unavailable", a.status, a.code)
	}
	var calls atomic.Int32
	ln, err = net.Listen("tcp", addr)
	if err != nil {
		t.Skipf("the port was taken meanwhile: %v", err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		w.WriteHeader(201)
	})}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	for range 2 {
		if b := do(t, "POST", gw.URL+"/withdraw", "s", "application/json", `{"amount":1}`, "Idempotency-Key", "k"); b.status != 201 {
			t.Fatalf("back up = %d %q; want 201", b.status, b.code)
		}
	}
	if n := calls.Load(); n != 1 {
		t.Errorf("upstream saw %d; want the retry once", n)
	}
}

// A key whose holder died in flight (its lease ran out) is taken over but
// not forwarded: it may have been.
func TestRecoveredKeyIsNotForwarded(t *testing.T) {
	u := newUpstream(t)
	store := &memstore.Store{}
	gw, _ := newGateway(t, u.srv.URL, []string{"POST /withdraw"}, func(c *gateway.Config) { c.Keys = store })
	id := idempotency.RecordID(idempotency.Scope{Principal: gateway.CookiePrincipal("s"), Method: "POST", Path: "/withdraw"}, "k")
	fp, _ := gateway.Fingerprint("application/json", []byte(`{"amount":1}`), "")
	if _, err := store.Begin(context.Background(), idemstore.BeginRequest{ID: id, Fingerprint: fp, Lease: time.Millisecond, TTL: time.Hour, Now: time.Now().Add(-time.Second)}); err != nil {
		t.Fatal(err)
	}
	a := do(t, "POST", gw.URL+"/withdraw", "s", "application/json", `{"amount":1}`, "Idempotency-Key", "k")
	if a.status != 502 || a.code != "upstream_outcome_unknown" {
		t.Errorf("= %d %q; want 502 upstream_outcome_unknown", a.status, a.code)
	}
	if n := u.count("POST /withdraw"); n != 0 {
		t.Errorf("upstream saw %d; want 0", n)
	}
}

// Other requests pass through: bodies streamed, websockets upgraded, a
// guarded route in another spelling refused, the gateway's own paths.
func TestPassThroughAndOwnPaths(t *testing.T) {
	u := newUpstream(t)
	u.set(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Upgrade") == "websocket" {
			c, brw, err := http.NewResponseController(w).Hijack()
			if err != nil {
				return
			}
			defer c.Close()
			_, _ = brw.WriteString("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n")
			_ = brw.Flush()
			line, _ := brw.ReadString('\n')
			_, _ = brw.WriteString("echo " + line)
			_ = brw.Flush()
			return
		}
		w.Header().Set("Set-Cookie", "a=b")
		_, _ = io.WriteString(w, r.Method+" "+r.URL.RequestURI()+" "+r.Header.Get("X-Forwarded-Proto"))
	})
	gw, _ := newGateway(t, u.srv.URL, []string{"POST /withdraw"})
	if a := do(t, "GET", gw.URL+"/page?q=1", "", "", ""); a.status != 200 || a.body != "GET /page?q=1 http" || a.header.Get("Set-Cookie") != "a=b" {
		t.Errorf("GET = %d %q %v", a.status, a.body, a.header)
	}
	big := strings.Repeat("x", 1<<20) // no body limit off the guarded routes
	u.set(func(w http.ResponseWriter, r *http.Request) {
		n, _ := io.Copy(io.Discard, r.Body)
		_, _ = io.WriteString(w, itoa(int(n)))
	})
	if a := do(t, "POST", gw.URL+"/upload", "", "text/plain", big); a.body != itoa(1<<20) {
		t.Errorf("1 MiB upload = %d %q", a.status, a.body)
	}
	if a := do(t, "POST", gw.URL+"/withdraw", "s", "text/plain", big, "Idempotency-Key", "k"); a.status != 413 {
		t.Errorf("1 MiB on a guarded route = %d; want 413", a.status)
	}
	for _, p := range []string{"/withdraw/", "/x/../withdraw", "/./withdraw"} {
		req, _ := http.NewRequest("POST", gw.URL, strings.NewReader("{}"))
		req.URL.Opaque = p
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 400 {
			t.Errorf("POST %s = %d; want 400, never unguarded", p, resp.StatusCode)
		}
	}

	u.set(func(w http.ResponseWriter, r *http.Request) {
		c, brw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		defer c.Close()
		_, _ = brw.WriteString("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n")
		_ = brw.Flush()
		line, _ := brw.ReadString('\n')
		_, _ = brw.WriteString("echo " + line)
		_ = brw.Flush()
	})
	c, err := net.Dial("tcp", strings.TrimPrefix(gw.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	_, _ = io.WriteString(c, "GET /ws HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n")
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != 101 {
		t.Fatalf("upgrade = %v %v; want 101", resp, err)
	}
	_, _ = io.WriteString(c, "hello\n")
	if line, _ := br.ReadString('\n'); line != "echo hello\n" {
		t.Errorf("through the websocket: %q; want echo hello", line)
	}

	if a := do(t, "GET", gw.URL+"/healthz", "", "", ""); a.status != 200 || !strings.Contains(a.body, `"ok"`) {
		t.Errorf("healthz = %d %q", a.status, a.body)
	}
	if a := do(t, "GET", gw.URL+"/readyz", "", "", ""); a.status != 200 || !strings.Contains(a.body, `"upstream":"ok"`) {
		t.Errorf("readyz = %d %q; want the upstream ok", a.status, a.body)
	}
	if a := do(t, "GET", gw.URL+"/onceguard/v1/snippet.js", "", "", ""); a.status != 200 || !strings.Contains(a.header.Get("Content-Type"), "javascript") || !strings.Contains(a.body, "/onceguard/v1/submit-tokens") {
		t.Errorf("snippet = %d %v", a.status, a.header)
	}
	if a := do(t, "GET", gw.URL+"/onceguard/nope", "", "", ""); a.status != 404 || a.code != "not_found" {
		t.Errorf("unknown own path = %d %q; want 404 not_found", a.status, a.code)
	}
	if a := do(t, "GET", gw.URL+"/metrics", "", "", ""); a.status != 200 || !strings.Contains(a.body, `onceguard_gateway_requests_total{code="413",outcome="answered",route="POST /withdraw"}`) {
		t.Errorf("metrics = %d, want the guarded route's 413 counted:\n%s", a.status, a.body)
	}
}

// With the upstream down, /readyz says degraded, still 200.
func TestReadyzUpstreamDown(t *testing.T) {
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	addr := ln.Addr().String()
	_ = ln.Close()
	gw, _ := newGateway(t, "http://"+addr, []string{"POST /withdraw"})
	if a := do(t, "GET", gw.URL+"/readyz", "", "", ""); a.status != 200 || !strings.Contains(a.body, `"status":"degraded"`) || !strings.Contains(a.body, `"upstream":"unreachable"`) {
		t.Errorf("readyz = %d %q; want 200 degraded, upstream unreachable", a.status, a.body)
	}
}

func TestNewRefuses(t *testing.T) {
	up, _ := url.Parse("http://127.0.0.1:1")
	r, _ := gateway.ParseRoute("POST /w withdrawal")
	for name, cfg := range map[string]gateway.Config{
		"no principal":          {Upstream: up, Keys: &memstore.Store{}},
		"two principals":        {Upstream: up, Keys: &memstore.Store{}, PrincipalCookie: "a", PrincipalHeader: "b"},
		"lease too short":       {Upstream: up, Keys: &memstore.Store{}, PrincipalCookie: "a", UpstreamTimeout: time.Second, KeyLease: time.Second},
		"token for no route":    {Upstream: up, Keys: &memstore.Store{}, PrincipalCookie: "a", Routes: []gateway.Route{r}, RequireToken: map[string]bool{"payment": true}},
		"no store":              {Upstream: up, PrincipalCookie: "a"},
		"upstream not http URL": {Upstream: &url.URL{Scheme: "ftp", Host: "x"}, Keys: &memstore.Store{}, PrincipalCookie: "a"},
	} {
		if _, err := gateway.New(cfg); err == nil {
			t.Errorf("%s: New succeeded; want an error", name)
		}
	}
}
