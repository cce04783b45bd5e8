package httpapi

// Fuzz targets for the router's path matching (route, match), the session
// token's sources (sessionToken: Authorization: Bearer and the cookie) and
// the CSRF wall (csrfSafe). Requests are read from the wire with
// net/http's own parser, as the server would. FuzzRouter
// (router_fuzz_test.go) drives the whole service.
//
//	go test -run XXX -fuzz FuzzRoute -fuzztime 45s -parallel 1 ./internal/httpapi/

import (
	"bufio"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/onceguard/onceguard/idempotency/memstore"
)

// reached is what a stub handler saw.
type reached struct {
	pattern, method, id string
}

// stubRouter is the service's real route table with every handler
// replaced by a stub that records what it was called for and answers 299.
func stubRouter(t testing.TB) (*server, *reached) {
	s, ok := New(Config{Keys: &memstore.Store{}}).(*server)
	if !ok {
		t.Fatal("New did not return *server")
	}
	got := new(reached)
	for pattern, methods := range s.routes {
		for method := range methods {
			methods[method] = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				*got = reached{pattern, method, r.PathValue("id")}
				w.WriteHeader(299)
			})
		}
	}
	return s, got
}

// readRequest parses head (a request line and header lines) as the
// server does, or returns nil when net/http refuses it.
func readRequest(head string) *http.Request {
	r, err := http.ReadRequest(bufio.NewReader(strings.NewReader(head + "\r\n")))
	if err != nil {
		return nil
	}
	r.RemoteAddr = "192.0.2.1:1234"
	return r
}

// checkProblem fails unless w is an application/problem+json answer
// with status and code.
func checkProblem(t *testing.T, what string, w *httptest.ResponseRecorder, status int, code string) {
	t.Helper()
	var p struct {
		Status int    `json:"status"`
		Code   string `json:"code"`
	}
	if w.Code != status || w.Header().Get("Content-Type") != "application/problem+json" ||
		json.Unmarshal(w.Body.Bytes(), &p) != nil || p.Status != status || p.Code != code {
		t.Fatalf("%s: %d %q %s; want %d problem+json %q", what, w.Code, w.Header().Get("Content-Type"), w.Body, status, code)
	}
}

// FuzzRoute: any method and request target either reaches the handler
// registered for exactly that method and path (an {id} being exactly one
// non-empty path segment, taken verbatim), or is 405 with the right
// Allow, or 404 not_found; /api/ answers are never cached.
func FuzzRoute(f *testing.F) {
	for _, target := range []string{
		"/healthz", "/readyz", "/metrics", "/", "/static/app.js", "*", "http://evil.test/api/v1/account",
		"/api/v1/account", "/api/v1/account/", "/api/v1//account", "//api/v1/account", "/API/V1/ACCOUNT",
		"/api/v1/orders", "/api/v1/orders/", "/api/v1/orders/ord_1", "/api/v1/orders/ord_1/", "/api/v1/orders/ord_1/payment",
		"/api/v1/orders/ord_1/payment/", "/api/v1/orders//payment", "/api/v1/orders/ord_1//payment", "/api/v1/orders/ord_1/payment/x",
		"/api/v1/orders/../users", "/api/v1/orders/./payment", "/api/v1/orders/..", "/api/v1/orders/%2E%2E/payment",
		"/api/v1/orders/a%2Fb", "/api/v1/orders/a%2Fpayment", "/api/v1/orders/a%2fb/payment", "/api/v1/orders/%00", "/api/v1/orders/%ff",
		"/api/v1/orders/ord_1?x=1", "/api/v1/orders/ord_1#frag", "/api/v1/orders/ord%201", "/api/v1/deposits/dep_1", "/api/v1/withdrawals/x",
		"/api/v1/sessions/current", "/api/v1/sessions/other", "/api/v1/users/u_1", "/api/v1/submit-tokens/x", "/api/v1/ledger/x/y",
		"/api/v1/" + strings.Repeat("a", 5000), "/api/v1/orders/" + strings.Repeat("%41", 2000) + "/payment",
	} {
		for _, m := range []string{"GET", "POST", "DELETE", "PUT", "HEAD", "OPTIONS", "PATCH", "BREW"} {
			f.Add(m, target)
		}
	}
	s, got := stubRouter(f)
	f.Fuzz(func(t *testing.T, method, target string) {
		r := readRequest(method + " " + target + " HTTP/1.1\r\nHost: example.test\r\n")
		if r == nil {
			return
		}
		*got = reached{}
		w := httptest.NewRecorder()
		s.ServeHTTP(w, r)
		path := r.URL.Path
		what := method + " " + target + " (path " + path + ")"
		if strings.HasPrefix(path, "/api/") && w.Header().Get("Cache-Control") != "no-store" {
			t.Fatalf("%s: Cache-Control %q; want no-store", what, w.Header().Get("Cache-Control"))
		}
		if id := w.Header().Get("X-Request-Id"); id == "" {
			t.Fatalf("%s: no X-Request-Id", what)
		}
		if w.Code == 299 {
			methods, ok := s.routes[got.pattern]
			want := r.Method
			if want == "HEAD" && methods["HEAD"] == nil {
				want = "GET" // HEAD is served by GET's handler
			}
			if !ok || got.method != want || methods[want] == nil {
				t.Fatalf("%s reached %+v", what, *got)
			}
			concrete := got.pattern
			if strings.Contains(got.pattern, "{id}") {
				if got.id == "" || strings.Contains(got.id, "/") {
					t.Fatalf("%s reached %s with id %q; want one non-empty segment", what, got.pattern, got.id)
				}
				concrete = strings.Replace(got.pattern, "{id}", got.id, 1)
			} else if got.id != "" {
				t.Fatalf("%s reached %s with id %q", what, got.pattern, got.id)
			}
			if concrete != path {
				t.Fatalf("%s reached %s (as %s); want the handler of exactly the path", what, got.pattern, concrete)
			}
			return
		}
		// Not routed: which pattern would have been?
		pattern, known := path, s.routes[path] != nil
		if !known {
			if rest, ok := strings.CutPrefix(path, "/api/v1/"); ok {
				if parts := strings.Split(rest, "/"); len(parts) >= 2 && len(parts) <= 3 && idRE.MatchString(parts[1]) { // ids: [a-z0-9_-]{1,64}
					pattern = "/api/v1/" + parts[0] + "/{id}"
					if len(parts) == 3 {
						pattern += "/" + parts[2]
					}
					known = s.routes[pattern] != nil
				}
			}
		}
		if !known {
			checkProblem(t, what, w, http.StatusNotFound, "not_found")
			return
		}
		checkProblem(t, what, w, http.StatusMethodNotAllowed, "method_not_allowed")
		var allow []string
		for m := range s.routes[pattern] {
			allow = append(allow, m)
			if m == "GET" {
				allow = append(allow, "HEAD")
			}
		}
		slices.Sort(allow)
		if w.Header().Get("Allow") != strings.Join(allow, ", ") || slices.Contains(allow, r.Method) {
			t.Fatalf("%s: 405 with Allow %q; the route has %q", what, w.Header().Get("Allow"), allow)
		}
	})
}

func unquote(v string) string {
	if len(v) >= 2 && v[0] == '"' && v[len(v)-1] == '"' {
		return v[1 : len(v)-1]
	}
	return v
}

// cookieValues returns the values of every cookie named name in the Cookie
// header lines, spaces around it and quotes removed.
func cookieValues(lines []string, name string) []string {
	var vals []string
	for _, line := range lines {
		for _, part := range strings.Split(line, ";") {
			n, v, ok := strings.Cut(part, "=")
			if ok && strings.TrimSpace(n) == name {
				vals = append(vals, unquote(strings.TrimSpace(v)))
			}
		}
	}
	return vals
}

// FuzzSessionToken: the session token is what follows "Bearer " (the
// scheme in any case) in the Authorization header, verbatim; else a value of the onceguard_session
// cookie (never of another cookie, never a name's prefix or suffix); else
// nothing.
func FuzzSessionToken(f *testing.F) {
	for _, a := range []string{"", "Bearer abc", "Bearer ", "Bearer  abc", "bearer abc", "BEARER abc", "Bearerabc", "Basic YWxpY2U6cA==", "Bearer abc def", "Bearer a\tb"} {
		for _, c := range []string{"", "onceguard_session=tok", "onceguard_session=\"tok\"", "x=1; onceguard_session=tok", "onceguard_session=a; onceguard_session=b",
			"xonceguard_session=evil", "onceguard_session_x=evil", "onceguard_session=", "onceguard_session=a b", "ONCEGUARD_SESSION=tok", " onceguard_session = tok "} {
			f.Add(a, c, "")
		}
	}
	f.Add("", "onceguard_session=a", "onceguard_session=b")
	f.Fuzz(func(t *testing.T, authz, cookie, cookie2 string) {
		head := "GET /api/v1/account HTTP/1.1\r\nHost: example.test\r\n"
		if authz != "" {
			head += "Authorization: " + authz + "\r\n"
		}
		for _, c := range []string{cookie, cookie2} {
			if c != "" {
				head += "Cookie: " + c + "\r\n"
			}
		}
		r := readRequest(head)
		if r == nil || len(r.Header.Values("Authorization")) > 1 {
			return
		}
		tok := sessionToken(r)
		if h := r.Header.Get("Authorization"); hasBearer(h) {
			if tok != h[len("Bearer "):] {
				t.Fatalf("Authorization %q: token %q; want what follows \"Bearer \"", h, tok)
			}
			return
		}
		if tok == "" {
			return
		}
		if !slices.Contains(cookieValues(r.Header.Values("Cookie"), SessionCookie), unquote(strings.TrimSpace(tok))) {
			t.Fatalf("Authorization %q, Cookie %q: token %q is no value of the %s cookie", authz, r.Header.Values("Cookie"), tok, SessionCookie)
		}
	})
}

// hasBearer tells whether an Authorization header is "Bearer " and a
// token, the scheme in any case.
func hasBearer(h string) bool { return len(h) >= 7 && strings.EqualFold(h[:7], "Bearer ") }

// TolerateNonBearerAuthorization (exported for FuzzRouter): KNOWN BUG, reported, not fixed yet.
// csrfSafe lets through any request with a non-empty Authorization
// header, but sessionToken takes only "Bearer ..." and otherwise falls back
// to the cookie: a state-changing request with the session cookie and
// "Authorization: Basic ..." (which a browser adds by itself for an origin
// behind HTTP Basic auth) or "Authorization: x" skips the CSRF checks
// and is authenticated by the cookie. Set this to false once csrfSafe
// only trusts what sessionToken uses.
const TolerateNonBearerAuthorization = false

// FuzzCSRF: a state-changing request authenticated by the session cookie
// passes csrfSafe only if it is same-origin as far as the browser says
// (Sec-Fetch-Site, Origin's scheme and host) and sends JSON (or is a
// DELETE without a body); a cross-site HTML form (urlencoded, multipart,
// text/plain) never does.
func FuzzCSRF(f *testing.F) {
	for _, m := range []string{"POST", "DELETE", "PUT", "PATCH", "GET"} {
		f.Add(m, "", true, "", "", "application/json", uint16(2))
		f.Add(m, "", true, "cross-site", "", "application/json", uint16(2))
		f.Add(m, "", true, "same-site", "https://evil.example.test", "application/json", uint16(2))
		f.Add(m, "", true, "", "http://example.test", "application/x-www-form-urlencoded", uint16(2))
		f.Add(m, "", true, "", "", "text/plain", uint16(2))
		f.Add(m, "", true, "", "", "multipart/form-data; boundary=x", uint16(2))
		f.Add(m, "", true, "", "null", "application/json", uint16(0))
		f.Add(m, "", true, "", "https://example.test", "application/json", uint16(2)) // the host, another scheme
		f.Add(m, "Bearer tok", true, "cross-site", "https://evil.test", "text/plain", uint16(2))
		f.Add(m, "Basic YWxpY2U6cA==", true, "same-site", "https://evil.example.test", "text/plain", uint16(2))
		f.Add(m, "", false, "cross-site", "https://evil.test", "text/plain", uint16(2))
	}
	f.Fuzz(func(t *testing.T, method, authz string, cookie bool, site, origin, ctype string, n uint16) {
		head := method + " /api/v1/withdrawals HTTP/1.1\r\nHost: example.test\r\n"
		for _, h := range [][2]string{{"Authorization", authz}, {"Sec-Fetch-Site", site}, {"Origin", origin}, {"Content-Type", ctype}} {
			if h[1] != "" {
				head += h[0] + ": " + h[1] + "\r\n"
			}
		}
		if cookie {
			head += "Cookie: " + SessionCookie + "=tok\r\n"
		}
		if n > 0 {
			head += "Content-Length: " + strconv.Itoa(int(n)) + "\r\n"
		}
		r := readRequest(head)
		if r == nil {
			return
		}
		safe := csrfSafe(r)
		switch r.Method {
		case "GET", "HEAD", "OPTIONS":
			if !safe {
				t.Fatalf("%s refused by csrfSafe; safe methods pass", r.Method)
			}
			return
		}
		byCookie := !hasBearer(r.Header.Get("Authorization")) && sessionToken(r) != ""
		if !safe || !byCookie {
			return
		}
		if TolerateNonBearerAuthorization && r.Header.Get("Authorization") != "" {
			return // the known, reported bug above
		}
		ct := r.Header.Get("Content-Type")
		sameOrigin := true
		switch r.Header.Get("Sec-Fetch-Site") {
		case "", "same-origin", "none":
		default:
			sameOrigin = false
		}
		if o := r.Header.Get("Origin"); o != "" {
			u, err := url.Parse(o)
			scheme, known := requestScheme(r)
			sameOrigin = sameOrigin && err == nil && u.Host == r.Host && (!known || strings.EqualFold(u.Scheme, scheme))
		}
		// A bodiless DELETE carries no form (forms only GET and POST).
		form := false
		for _, enc := range []string{"application/x-www-form-urlencoded", "multipart/form-data", "text/plain"} {
			form = form || strings.HasPrefix(strings.ToLower(strings.TrimSpace(ct)), enc)
		}
		bodilessDelete := r.Method == "DELETE" && r.ContentLength == 0
		isJSON := strings.HasPrefix(ct, "application/json")
		if !sameOrigin || !bodilessDelete && (form || !isJSON) {
			t.Fatalf("%s with the session cookie, Authorization %q, Sec-Fetch-Site %q, Origin %q, Content-Type %q, %d bytes passed csrfSafe",
				r.Method, r.Header.Get("Authorization"), r.Header.Get("Sec-Fetch-Site"), r.Header.Get("Origin"), ct, r.ContentLength)
		}
	})
}
