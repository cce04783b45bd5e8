package httpapi_test

import (
	"net/http/httptest"
	"strings"
	"testing"
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
