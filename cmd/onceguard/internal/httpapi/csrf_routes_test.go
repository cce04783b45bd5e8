package httpapi_test

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/onceguard/onceguard/cmd/onceguard/internal/httpapi"
)

// Every state-changing route refuses a request a foreign page makes a browser send with the
// session cookie (PITFALLS: "every state-changing endpoint needs the same origin rule"): a
// cross-site no-cors form (text/plain) and a cross-site JSON fetch answer 403 csrf_rejected
// and change nothing, on every route the router has, the ones added later too. Each forgery
// carries what would make it succeed (a valid body, a fresh submit token of its purpose, a real
// order), and the same request sent from the page's own origin does succeed.
func TestCrossSiteCookieRefusedOnEveryRoute(t *testing.T) {
	o := newObsHarness(t, nil, nil)
	o.fundedToken(t) // 100.00 to move
	code, order, _ := o.call("POST", "/api/v1/orders", "order-1", `{"amount":"5.00"}`)
	orderID, _ := order["id"].(string)
	if code != 201 || orderID == "" {
		t.Fatalf("order = %d %v", code, order)
	}
	// What a forgery of each route sends: its body, and the submit token's purpose of a keyed
	// route ("" for none).
	forged := map[string]struct{ body, purpose string }{
		"POST /api/v1/users":               {`{"username":"mallory","password":"correct horse"}`, ""},
		"POST /api/v1/sessions":            {`{"username":"alice","password":"correct horse"}`, ""},
		"DELETE /api/v1/sessions/current":  {``, ""},
		"POST /api/v1/submit-tokens":       {`{"purpose":"withdrawal"}`, ""},
		"POST /api/v1/deposits":            {`{"amount":"7.00"}`, "deposit"},
		"POST /api/v1/withdrawals":         {`{"amount":"7.00"}`, "withdrawal"},
		"POST /api/v1/orders":              {`{"amount":"7.00"}`, "order"},
		"POST /api/v1/orders/{id}/payment": {`{"method":"wallet"}`, "payment"},
	}
	mint := func(purpose string) string {
		t.Helper()
		code, out, _ := o.call("POST", "/api/v1/submit-tokens", "", `{"purpose":"`+purpose+`"}`)
		tok, _ := out["token"].(string)
		if code != 201 || tok == "" {
			t.Fatalf("submit token %s = %d %v", purpose, code, out)
		}
		return tok
	}
	send := func(route, site, origin, ctype string) *httptest.ResponseRecorder {
		method, pattern, _ := strings.Cut(route, " ")
		f := forged[route]
		r := httptest.NewRequest(method, strings.ReplaceAll(pattern, "{id}", orderID), strings.NewReader(f.body))
		r.AddCookie(&http.Cookie{Name: httpapi.SessionCookie, Value: o.token})
		if f.body != "" {
			r.Header.Set("Content-Type", ctype)
		}
		if f.purpose != "" {
			r.Header.Set("Idempotency-Key", mint(f.purpose))
		}
		for k, v := range map[string]string{"Sec-Fetch-Site": site, "Origin": origin} {
			if v != "" {
				r.Header.Set(k, v)
			}
		}
		w := httptest.NewRecorder()
		o.h.ServeHTTP(w, r)
		return w
	}
	state := func() string {
		t.Helper()
		var b strings.Builder
		for _, p := range []string{"/api/v1/account", "/api/v1/ledger", "/api/v1/deposits", "/api/v1/withdrawals", "/api/v1/orders"} {
			w := serveJSON(o.h, o.token, "GET", p, "", "")
			if w.Code != 200 {
				t.Fatalf("GET %s = %d %s (the session must still work)", p, w.Code, w.Body)
			}
			b.WriteString(w.Body.String())
		}
		return b.String()
	}
	before := state()
	var stateChanging []string
	for _, route := range httpapi.Routes(o.h) {
		method, pattern, _ := strings.Cut(route, " ")
		if method == "GET" || strings.HasPrefix(pattern, "/api/v1/psp/") { // a provider's callback: its signature, no cookie
			continue
		}
		if _, ok := forged[route]; !ok {
			t.Fatalf("route %s has no forgery in this test: add one", route)
		}
		stateChanging = append(stateChanging, route)
		for _, tc := range []struct{ name, site, origin, ctype string }{
			{"cross-site no-cors form", "cross-site", "https://evil.example", "text/plain"},
			{"cross-site JSON", "cross-site", "https://evil.example", "application/json"},
			{"another origin, old browser", "", "https://evil.example", "application/json"},
		} {
			if w := send(route, tc.site, tc.origin, tc.ctype); w.Code != 403 || !strings.Contains(w.Body.String(), `"code":"csrf_rejected"`) {
				t.Errorf("%s, %s with the session cookie = %d %s; want 403 csrf_rejected", route, tc.name, w.Code, w.Body)
			}
		}
	}
	if len(stateChanging) != len(forged) {
		t.Errorf("state-changing routes %q; want every one this test forges", stateChanging)
	}
	if after := state(); after != before {
		t.Errorf("the forgeries changed the account:\nbefore %s\nafter  %s", before, after)
	}
	// The same requests from the page's own origin go through: the refusals above were the
	// origin rule's (the sign-out last, so that the others still have a session).
	for _, route := range stateChanging {
		if route == "DELETE /api/v1/sessions/current" {
			continue
		}
		if w := send(route, "same-origin", "http://example.com", "application/json"); w.Code != 201 {
			t.Errorf("%s from the page's origin = %d %s; want 201", route, w.Code, w.Body)
		}
	}
	if w := send("DELETE /api/v1/sessions/current", "same-origin", "http://example.com", ""); w.Code != 204 {
		t.Errorf("sign-out from the page's origin = %d %s; want 204", w.Code, w.Body)
	}
}
