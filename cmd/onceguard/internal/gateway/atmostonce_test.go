package gateway_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/onceguard/onceguard/cmd/onceguard/internal/gateway"
	"github.com/onceguard/onceguard/idempotency"
	"github.com/onceguard/onceguard/idempotency/idemstore"
	"github.com/onceguard/onceguard/idempotency/memstore"
)

// flakyComplete is a memstore whose next Complete fails once (a database
// blip, a statement timeout, a packet over max_allowed_packet), while
// Abandon still works.
type flakyComplete struct {
	*memstore.Store
	fail atomic.Int32
}

func (s *flakyComplete) Complete(ctx context.Context, id, lease string, resp idemstore.Response, now time.Time) error {
	if s.fail.Add(-1) >= 0 {
		return errors.New("complete: connection reset by peer")
	}
	return s.Store.Complete(ctx, id, lease, resp, now)
}

// An upstream answer that could not be stored must not free the key: the
// upstream may have moved money before its 5xx (or before it stopped
// answering), and the contract says the key is never forwarded again.
func TestUnstoredAnswerNeverForwardedAgain(t *testing.T) {
	for name, h := range map[string]func(w http.ResponseWriter, r *http.Request){
		"5xx": func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(http.StatusInternalServerError)
			_, _ = io.WriteString(w, "boom after the debit")
		},
		"4xx": func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(http.StatusConflict)
			_, _ = io.WriteString(w, "already paid")
		},
		"no answer": func(w http.ResponseWriter, r *http.Request) {
			time.Sleep(400 * time.Millisecond) // past the upstream timeout
		},
	} {
		t.Run(name, func(t *testing.T) {
			u := newUpstream(t)
			u.set(h)
			store := &flakyComplete{Store: &memstore.Store{}}
			store.fail.Store(1)
			gw, _ := newGateway(t, u.srv.URL, []string{"POST /withdraw"}, func(c *gateway.Config) {
				c.Keys, c.UpstreamTimeout = store, 200*time.Millisecond
			})
			first := do(t, "POST", gw.URL+"/withdraw", "s", "application/json", `{"amount":1}`, "Idempotency-Key", "k")
			t.Logf("first: %d %q", first.status, first.code)
			for range 2 {
				_ = do(t, "POST", gw.URL+"/withdraw", "s", "application/json", `{"amount":1}`, "Idempotency-Key", "k")
			}
			if n := u.count("POST /withdraw"); n != 1 {
				t.Errorf("upstream saw the key %d times; want 1 (at most once)", n)
			}
		})
	}
}

// The key field is read from a JSON body whatever its Content-Type (a
// fetch() without headers sends text/plain;charset=UTF-8), but such a
// body is fingerprinted as its bytes, key included: one intent sent
// under two submit tokens has two fingerprints and the repeat window
// lets both through to the upstream. The contract: the key field is left
// out, so that the window sees it (docs/gateway.md: a body of another
// type "must" carry its key in the header).
func TestKeyFieldTextPlainJSONBypassesWindow(t *testing.T) {
	u := newUpstream(t)
	gw, _ := newGateway(t, u.srv.URL, []string{"POST /pay"}, func(c *gateway.Config) {
		c.KeyField, c.Window = "token", time.Minute
	})
	for i, tok := range []string{"t1", "t2"} {
		a := do(t, "POST", gw.URL+"/pay", "s", "text/plain;charset=UTF-8", `{"amount":5,"token":"`+tok+`"}`)
		t.Logf("request %d under %s: %d %q", i+1, tok, a.status, a.code)
	}
	if n := u.count("POST /pay"); n != 1 {
		t.Errorf("upstream saw %d payments of one intent sent under two keys within the window; want 1 (the second 429 duplicate_submission, or refused for its key)", n)
	}
}

// HTTP methods are case-sensitive, but many upstream stacks are not:
// Django (request.method = environ["REQUEST_METHOD"].upper()), Werkzeug
// (Flask), Rails' Rack::Request#request_method normalisation... A guarded
// route sent as "post" passes through unguarded, the way a non-canonical
// path would, which the gateway refuses for that very reason.
func TestLowerCaseMethodBypassesGuard(t *testing.T) {
	u := newUpstream(t)
	u.set(func(w http.ResponseWriter, r *http.Request) {
		if strings.ToUpper(r.Method) == "POST" { // the framework's view
			w.WriteHeader(http.StatusCreated)
		}
	})
	gw, _ := newGateway(t, u.srv.URL, []string{"POST /withdraw"})
	for range 2 {
		a := do(t, "post", gw.URL+"/withdraw", "s", "application/json", `{"amount":1}`, "Idempotency-Key", "k")
		t.Logf("post /withdraw: %d %q replayed=%q", a.status, a.code, a.header.Get("Idempotent-Replayed"))
	}
	if n := u.count("post /withdraw"); n > 1 {
		t.Errorf("the upstream ran the guarded route %d times under one key; want at most 1 (guarded, or refused 400)", n)
	}
}

// net/http's Transport re-sends a GET, HEAD, OPTIONS or TRACE on a fresh
// connection when a kept-alive one broke after the request was written,
// whatever its headers (Request.isReplayable): the lower-case
// Idempotency-Key spelling only covers the other methods. A guarded GET
// (a legacy PHP confirm link) that the upstream read and acted on before
// its connection broke is sent again.
func TestGuardedGETResentByTransport(t *testing.T) {
	u := newUpstream(t)
	gw, _ := newGateway(t, u.srv.URL, []string{"GET /confirm.php"})
	if a := do(t, "GET", gw.URL+"/confirm.php?id=1", "s", "", "", "Idempotency-Key", "warm"); a.status != 201 {
		t.Fatalf("warm-up = %d", a.status)
	}
	u.mu.Lock()
	te, cl := u.last.TransferEncoding, u.last.ContentLength
	u.mu.Unlock()
	if te != nil || cl != 0 {
		t.Errorf("upstream's GET had Transfer-Encoding %v, Content-Length %d; want no body", te, cl)
	}
	u.set(func(w http.ResponseWriter, r *http.Request) {
		c, _, err := http.NewResponseController(w).Hijack()
		if err == nil {
			_ = c.Close() // read, acted on, then the connection broke
		}
	})
	a := do(t, "GET", gw.URL+"/confirm.php?id=2", "s", "", "", "Idempotency-Key", "dies")
	t.Logf("= %d %q", a.status, a.code)
	if n := u.count("GET /confirm.php"); n != 2 { // warm-up and the one that died
		t.Errorf("upstream saw %d; want 2: the Transport re-sent the guarded GET", n)
	}
}

// With --principal-header, a proxy in front that appends its header
// (HAProxy add-header, Envoy append) instead of overwriting it leaves the
// client's own value first, and the gateway takes the first: the client
// chooses whose keys they are, while the upstream sees both values.
// Two values of the principal header can only mean that; refuse them.
func TestPrincipalHeaderTwice(t *testing.T) {
	u := newUpstream(t)
	gw, _ := newGateway(t, u.srv.URL, []string{"POST /w"}, func(c *gateway.Config) { c.PrincipalCookie, c.PrincipalHeader = "", "X-User-Id" })
	req, _ := http.NewRequest("POST", gw.URL+"/w", strings.NewReader(`{}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", "k")
	req.Header.Add("X-User-Id", "victim")   // the client's
	req.Header.Add("X-User-Id", "attacker") // the proxy's, appended
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 401 || u.count("POST /w") != 0 {
		t.Errorf("two principal headers = %d, upstream saw %d; want 401 unauthenticated, nothing forwarded", resp.StatusCode, u.count("POST /w"))
	}
}

// The query is forwarded (the upstream acts on it: pay.php?order=7) but
// is neither in the key's scope nor in the fingerprint: the same form
// for two orders is one "intent" (the second order's payment refused 429
// for the window), and one key reused for another order replays the
// first order's answer (the second never paid, the client told it was)
// instead of 422 idempotency_key_reused.
func TestQueryIsPartOfTheRequest(t *testing.T) {
	u := newUpstream(t)
	gw, _ := newGateway(t, u.srv.URL, []string{"POST /pay.php"}, func(c *gateway.Config) { c.Window = time.Minute })
	const form = "application/x-www-form-urlencoded"
	if a := do(t, "POST", gw.URL+"/pay.php?order=7", "s", form, "confirm=1", "Idempotency-Key", "k7"); a.status != 201 {
		t.Fatalf("order 7 = %d", a.status)
	}
	if a := do(t, "POST", gw.URL+"/pay.php?order=8", "s", form, "confirm=1", "Idempotency-Key", "k8"); a.status != 201 {
		t.Errorf("order 8 under its own key = %d %q; want forwarded, another order is another request", a.status, a.code)
	}
	if a := do(t, "POST", gw.URL+"/pay.php?order=9", "s", form, "confirm=1", "Idempotency-Key", "k7"); a.status != 422 {
		t.Errorf("order 9 under order 7's key = %d %q replayed=%q; want 422 idempotency_key_reused, not order 7's answer", a.status, a.code, a.header.Get("Idempotent-Replayed"))
	}
}

// A key taken over from a gateway that died holding it (Recovered) may
// have been forwarded: it must never be. But Begin's window check frees
// the recovered record when another key holds the body's window (or the
// window store fails): 429, the key now unknown to the store, and once
// the window passed the same key is forwarded as new.
func TestRecoveredKeyFreedByWindow(t *testing.T) {
	u := newUpstream(t)
	var sawK1 atomic.Int32
	u.set(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Idempotency-Key") == "k1" {
			sawK1.Add(1)
		}
		w.WriteHeader(201)
	})
	store := &memstore.Store{}
	gw, _ := newGateway(t, u.srv.URL, []string{"POST /withdraw"}, func(c *gateway.Config) { c.Keys, c.Window = store, 300*time.Millisecond })
	const body = `{"amount":1}`
	// k1 was forwarded by a gateway that died before storing the answer.
	id := idempotency.RecordID(idempotency.Scope{Principal: gateway.CookiePrincipal("s"), Method: "POST", Path: "/withdraw"}, "k1")
	fp, _ := gateway.Fingerprint("application/json", []byte(body), "")
	if _, err := store.Begin(context.Background(), idemstore.BeginRequest{ID: id, Fingerprint: fp, Lease: time.Millisecond, TTL: time.Hour, Now: time.Now().Add(-time.Second)}); err != nil {
		t.Fatal(err)
	}
	// The user, not knowing, sends the same withdrawal under a new key.
	if a := do(t, "POST", gw.URL+"/withdraw", "s", "application/json", body, "Idempotency-Key", "k2"); a.status != 201 {
		t.Fatalf("k2 = %d %q", a.status, a.code)
	}
	// The retry of k1 meets k2's window entry.
	a := do(t, "POST", gw.URL+"/withdraw", "s", "application/json", body, "Idempotency-Key", "k1")
	t.Logf("k1 retry within the window: %d %q", a.status, a.code)
	time.Sleep(400 * time.Millisecond)
	b := do(t, "POST", gw.URL+"/withdraw", "s", "application/json", body, "Idempotency-Key", "k1")
	t.Logf("k1 retry after the window: %d %q", b.status, b.code)
	if n := sawK1.Load(); n != 0 {
		t.Errorf("the upstream got k1 %d times after its first holder died with it in flight; want 0 (upstream_outcome_unknown)", n)
	}
}
