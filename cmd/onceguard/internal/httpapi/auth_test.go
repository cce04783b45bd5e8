package httpapi_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/onceguard/onceguard/cmd/onceguard/internal/httpapi"
)

// The Authorization scheme is case-insensitive (RFC 9110 section 11.1),
// and every 401 names the scheme to use in WWW-Authenticate (section
// 11.6.1): on plain and on keyed routes, and for wrong credentials.
func TestBearerSchemeAndChallenge(t *testing.T) {
	o := newObsHarness(t, nil, nil)
	for _, scheme := range []string{"Bearer", "bearer", "BEARER"} {
		r := httptest.NewRequest("GET", "/api/v1/account", nil)
		r.Header.Set("Authorization", scheme+" "+o.token)
		w := httptest.NewRecorder()
		o.h.ServeHTTP(w, r)
		if w.Code != 200 {
			t.Errorf("Authorization %q = %d; want 200", scheme+" …", w.Code)
		}
	}
	for _, tc := range []struct{ method, path, key, body string }{
		{"GET", "/api/v1/account", "", ""},
		{"POST", "/api/v1/deposits", "k1", `{"amount":"1"}`},
		{"POST", "/api/v1/sessions", "", `{"username":"alice","password":"wrong password"}`},
	} {
		w := serveJSON(o.h, "", tc.method, tc.path, tc.key, tc.body)
		if w.Code != 401 || !strings.HasPrefix(w.Header().Get("WWW-Authenticate"), "Bearer") {
			t.Errorf("%s %s without a session = %d, WWW-Authenticate %q; want 401 with a Bearer challenge", tc.method, tc.path, w.Code, w.Header().Get("WWW-Authenticate"))
		}
	}
}

// Login CSRF: a sign-in that a browser sends from another site (which a
// cross-site form can do: SameSite keeps cookies off it, but not the
// cookie the answer sets) is refused, so no page can sign a visitor in as
// its author. Clients that are not browsers send no Origin and sign in.
func TestCrossSiteSignInRefused(t *testing.T) {
	o := newObsHarness(t, nil, nil)
	const creds = `{"username":"alice","password":"correct horse"}`
	for _, tc := range []struct {
		name, site, origin, ctype string
		want                      int
	}{
		{"no browser headers", "", "", "application/json", 201},
		{"same origin", "same-origin", "http://example.com", "application/json", 201},
		{"cross-site form", "cross-site", "https://evil.test", "text/plain", 403},
		{"cross-site, JSON", "cross-site", "", "application/json", 403},
		{"another origin, old browser", "", "https://evil.test", "application/x-www-form-urlencoded", 403},
		{"same site, another host", "same-site", "http://sub.example.com", "application/json", 403},
	} {
		r := httptest.NewRequest("POST", "/api/v1/sessions", strings.NewReader(creds))
		r.Header.Set("Content-Type", tc.ctype)
		for k, v := range map[string]string{"Sec-Fetch-Site": tc.site, "Origin": tc.origin} {
			if v != "" {
				r.Header.Set(k, v)
			}
		}
		w := httptest.NewRecorder()
		o.h.ServeHTTP(w, r)
		if w.Code != tc.want {
			t.Errorf("%s: sign-in = %d %s; want %d", tc.name, w.Code, w.Body, tc.want)
		}
		if tc.want == 403 && (w.Header().Get("Set-Cookie") != "" || !strings.Contains(w.Body.String(), "csrf_rejected")) {
			t.Errorf("%s: refused sign-in set %q, body %s; want no cookie, csrf_rejected", tc.name, w.Header().Get("Set-Cookie"), w.Body)
		}
	}
}

// HEAD is served wherever GET is (RFC 9110 section 9.3.2), without a
// body, and a 405 lists it in Allow.
func TestHead(t *testing.T) {
	o := newObsHarness(t, nil, nil)
	for _, path := range []string{"/healthz", "/api/v1/account"} {
		r := httptest.NewRequest("HEAD", path, nil)
		r.Header.Set("Authorization", "Bearer "+o.token)
		w := httptest.NewRecorder()
		o.h.ServeHTTP(w, r)
		if w.Code != 200 {
			t.Errorf("HEAD %s = %d; want 200", path, w.Code)
		}
	}
	w := serveJSON(o.h, o.token, "PUT", "/api/v1/account", "", "")
	if w.Code != 405 || w.Header().Get("Allow") != "GET, HEAD" {
		t.Errorf("PUT /api/v1/account = %d, Allow %q; want 405, GET, HEAD", w.Code, w.Header().Get("Allow"))
	}
}

// Sign-in attempts sent at once are each counted before it is made: of 30
// wrong passwords for one user from one address, sent together, only the
// 5 the limit allows are checked (401); the rest are refused (429) before
// any hash. When failures were counted after the slow hash, every request
// that arrived while earlier ones hashed passed the check (a review got 47
// password checks out of 60).
func TestParallelGuessesCounted(t *testing.T) {
	o := newObsHarness(t, nil, nil) // LoginAttempts: the default, 5 per (username, address)
	var n401, n429, other atomic.Int32
	var wg sync.WaitGroup
	for range 30 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			switch serveJSON(o.h, "", "POST", "/api/v1/sessions", "", `{"username":"alice","password":"wrong password"}`).Code {
			case 401:
				n401.Add(1)
			case 429:
				n429.Add(1)
			default:
				other.Add(1)
			}
		}()
	}
	wg.Wait()
	if n401.Load() != 5 || n429.Load() != 25 || other.Load() != 0 {
		t.Errorf("30 wrong passwords at once: %d × 401, %d × 429, %d other; want 5, 25, 0", n401.Load(), n429.Load(), other.Load())
	}
	if w := serveJSON(o.h, "", "POST", "/api/v1/sessions", "", `{"username":"alice","password":"correct horse"}`); w.Code != 429 {
		t.Errorf("the right password from that address after them = %d; want 429 until the window ends", w.Code)
	}
}

// A sign-up counts against its address once its password is hashed, even
// if the client hangs up meanwhile: the user is still created, and the
// next sign-up from that address is over the limit. One that never got a
// hashing slot (503 busy) gives its count back. (The harness signs alice
// up from the same address first: a limit of 2 leaves one sign-up.)
func TestSignupCountedOnceHashed(t *testing.T) {
	signup := func(h http.Handler, name string, cancelled bool) int {
		r := httptest.NewRequest("POST", "/api/v1/users", strings.NewReader(`{"username":"`+name+`","password":"correct horse"}`))
		r.Header.Set("Content-Type", "application/json")
		if cancelled {
			ctx, cancel := context.WithCancel(r.Context())
			cancel()
			r = r.WithContext(ctx)
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w.Code
	}
	limit2 := func(c *harnessConfig) { c.SignupLimit = 2 }

	t.Run("hung up during the hash", func(t *testing.T) {
		o := newObsHarness(t, nil, nil, limit2)
		// A slot is free, so the hash runs although the request has
		// ended; the user is created on a context of its own.
		if code := signup(o.h, "gone", true); code != 201 {
			t.Fatalf("sign-up whose client hung up = %d; want 201 (created, though nobody reads it)", code)
		}
		if w := serveJSON(o.h, "", "POST", "/api/v1/sessions", "", `{"username":"gone","password":"correct horse"}`); w.Code != 201 {
			t.Errorf("signing in as the user created after the hang-up = %d; want 201", w.Code)
		}
		if code := signup(o.h, "next", false); code != 429 {
			t.Errorf("the next sign-up from the address = %d; want 429 (the hashed one counted)", code)
		}
	})

	t.Run("no hashing slot", func(t *testing.T) {
		o := newObsHarness(t, nil, nil, limit2)
		release, ok := httpapi.HoldHashSlots(o.h)
		if !ok {
			t.Fatal("HoldHashSlots: not a handler from httpapi.New")
		}
		code := signup(o.h, "waited", true) // all slots held, the request ends: busy
		release()
		if code != 503 {
			t.Fatalf("sign-up with every hashing slot taken = %d; want 503 busy", code)
		}
		if code := signup(o.h, "after", false); code != 201 {
			t.Errorf("the next sign-up from the address = %d; want 201 (the busy one gave its count back)", code)
		}
	})
}

// A sign-in name that no user can have (it fails the username rule) is
// refused without a hash and counts against the client's address only:
// long made-up names cannot fill the per-name counters.
func TestInvalidNamesNotCounted(t *testing.T) {
	o := newObsHarness(t, nil, nil)
	before, _ := httpapi.Sizes(o.h)
	codes := map[int]int{}
	for i := range 30 {
		name := fmt.Sprintf("%d-%s", i, strings.Repeat("X", 10<<10))
		codes[serveJSON(o.h, "", "POST", "/api/v1/sessions", "", `{"username":"`+name+`","password":"whatever it is"}`).Code]++
	}
	after, _ := httpapi.Sizes(o.h)
	// The address may fail 4 × 5 = 20 times in its window.
	if codes[401] != 20 || codes[429] != 10 {
		t.Errorf("30 invalid names from one address: %v; want 20 × 401, then 10 × 429", codes)
	}
	if after.LoginUser != before.LoginUser || after.LoginPair != before.LoginPair {
		t.Errorf("per-name counters went from %+v to %+v; want them untouched", before, after)
	}
}

// Every API answer, success or problem, forbids content sniffing: JSON
// that carries a user's text is never rendered as HTML.
func TestAPINoSniff(t *testing.T) {
	o := newObsHarness(t, nil, nil)
	for _, tc := range []struct{ token, method, path, key, body string }{
		{o.token, "GET", "/api/v1/account", "", ""},
		{"", "GET", "/api/v1/account", "", ""},
		{o.token, "POST", "/api/v1/orders", "o-1", `{"amount":"1.00","description":"<script>alert(1)</script>"}`},
		{o.token, "GET", "/api/v1/nowhere", "", ""},
	} {
		w := serveJSON(o.h, tc.token, tc.method, tc.path, tc.key, tc.body)
		if got := w.Header().Get("X-Content-Type-Options"); got != "nosniff" {
			t.Errorf("%s %s = %d, X-Content-Type-Options %q; want nosniff", tc.method, tc.path, w.Code, got)
		}
	}
}

// The session cookie is Secure over TLS (or a proxy that says so), and on
// every sign-in with SecureCookies, for a TLS proxy that says nothing.
func TestSecureCookies(t *testing.T) {
	for _, force := range []bool{false, true} {
		o := newObsHarness(t, nil, nil, func(c *harnessConfig) { c.SecureCookies = force })
		for _, proto := range []string{"", "https"} {
			r := httptest.NewRequest("POST", "/api/v1/sessions", strings.NewReader(`{"username":"alice","password":"correct horse"}`))
			r.Header.Set("Content-Type", "application/json")
			if proto != "" {
				r.Header.Set("X-Forwarded-Proto", proto)
			}
			w := httptest.NewRecorder()
			o.h.ServeHTTP(w, r)
			cookies := w.Result().Cookies()
			if w.Code != 201 || len(cookies) != 1 {
				t.Fatalf("SecureCookies %v, proto %q: sign-in = %d, %d cookies; want 201, one", force, proto, w.Code, len(cookies))
			}
			if want := force || proto == "https"; cookies[0].Secure != want {
				t.Errorf("SecureCookies %v, proto %q: cookie Secure = %v; want %v", force, proto, cookies[0].Secure, want)
			}
		}
	}
}

// A request whose client went away while the store worked is answered 503
// request_interrupted and logged at info: not a 500, which dashboards and
// alerts read as a bug of the service, nor an error line.
func TestClientGoneIsNotAnError(t *testing.T) {
	o := newObsHarness(t, nil, nil)
	for _, path := range []string{"/api/v1/account", "/api/v1/ledger", "/api/v1/withdrawals"} {
		r := httptest.NewRequest("GET", path, nil)
		r.Header.Set("Authorization", "Bearer "+o.token)
		ctx, cancel := context.WithCancel(r.Context())
		cancel()
		w := httptest.NewRecorder()
		o.h.ServeHTTP(w, r.WithContext(ctx))
		if w.Code != 503 || !strings.Contains(w.Body.String(), `"code":"request_interrupted"`) || w.Header().Get("Retry-After") == "" {
			t.Errorf("GET %s, client gone = %d %v %s; want 503 request_interrupted with Retry-After", path, w.Code, w.Header(), w.Body)
		}
	}
	if l := o.lines(t, "request failed"); len(l) != 0 {
		t.Errorf("error lines for clients that went away: %v; want none", l)
	}
	if l := o.lines(t, "request ended before it was answered"); len(l) != 3 {
		t.Errorf("info lines: %d; want one per request (3)", len(l))
	}
	if n := o.value(t, "onceguard_http_requests_total", "route", "/api/v1/account", "method", "GET", "code", "500"); n != 0 {
		t.Errorf("requests counted as 500: %v; want 0", n)
	}
}
