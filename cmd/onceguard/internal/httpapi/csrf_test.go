package httpapi_test

import (
	"net/http/httptest"
	"strings"
	"testing"
)

// A sign-up that a browser sends from another site is refused like a
// sign-in: a foreign page's no-cors text/plain POST creates no user.
func TestCrossSiteSignUpRefused(t *testing.T) {
	o := newObsHarness(t, nil, nil)
	for i, tc := range []struct {
		name, site, origin, ctype string
		want                      int
	}{
		{"cross-site no-cors form", "cross-site", "https://evil.example", "text/plain", 403},
		{"cross-site, JSON", "cross-site", "", "application/json", 403},
		{"another origin, old browser", "", "https://evil.example", "application/json", 403},
		{"same site, another host", "same-site", "http://sub.example.com", "application/json", 403},
		{"no browser headers", "", "", "application/json", 201},
		{"same origin", "same-origin", "http://example.com", "application/json; charset=utf-8", 201},
	} {
		name := "user" + string(rune('a'+i))
		r := httptest.NewRequest("POST", "/api/v1/users", strings.NewReader(`{"username":"`+name+`","password":"correct horse"}`))
		r.Header.Set("Content-Type", tc.ctype)
		for k, v := range map[string]string{"Sec-Fetch-Site": tc.site, "Origin": tc.origin} {
			if v != "" {
				r.Header.Set(k, v)
			}
		}
		w := httptest.NewRecorder()
		o.h.ServeHTTP(w, r)
		if w.Code != tc.want || tc.want == 403 && !strings.Contains(w.Body.String(), `"code":"csrf_rejected"`) {
			t.Errorf("%s: sign-up = %d %s; want %d", tc.name, w.Code, w.Body, tc.want)
		}
		if tc.want == 403 {
			// The refused name is still free.
			if w := serveJSON(o.h, "", "POST", "/api/v1/users", "", `{"username":"`+name+`","password":"correct horse"}`); w.Code != 201 {
				t.Errorf("%s: the same sign-up without browser headers = %d %s; want 201 (nothing was created)", tc.name, w.Code, w.Body)
			}
		}
	}
}

// Every endpoint that reads a JSON body refuses another media type with
// 415 unsupported_media_type, Bearer or not, before doing anything.
func TestJSONContentTypeRequired(t *testing.T) {
	o := newObsHarness(t, nil, nil)
	for _, tc := range []struct{ path, key, body string }{
		{"/api/v1/users", "", `{"username":"bob","password":"correct horse"}`},
		{"/api/v1/sessions", "", `{"username":"alice","password":"correct horse"}`},
		{"/api/v1/submit-tokens", "", `{"purpose":"deposit"}`},
		{"/api/v1/deposits", "ct-1", `{"amount":"1.00"}`},
		{"/api/v1/withdrawals", "ct-2", `{"amount":"1.00"}`},
		{"/api/v1/orders", "ct-3", `{"amount":"1.00"}`},
	} {
		for _, ctype := range []string{"text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x", "application/jsonx", "", "garbage;;"} {
			r := httptest.NewRequest("POST", tc.path, strings.NewReader(tc.body))
			if ctype != "" {
				r.Header.Set("Content-Type", ctype)
			}
			r.Header.Set("Authorization", "Bearer "+o.token)
			if tc.key != "" {
				r.Header.Set("Idempotency-Key", tc.key)
			}
			w := httptest.NewRecorder()
			o.h.ServeHTTP(w, r)
			if w.Code != 415 || !strings.Contains(w.Body.String(), `"code":"unsupported_media_type"`) || w.Header().Get("Content-Type") != "application/problem+json" {
				t.Errorf("POST %s as %q = %d %s; want 415 unsupported_media_type", tc.path, ctype, w.Code, w.Body)
			}
		}
	}
	code, acct, _ := o.call("GET", "/api/v1/account", "", "")
	if code != 200 || acct["balance"] != "0.00" {
		t.Errorf("account after the refused requests = %d %v; want balance 0.00", code, acct)
	}
	if w := serveJSON(o.h, "", "POST", "/api/v1/users", "", `{"username":"bob","password":"correct horse"}`); w.Code != 201 {
		t.Errorf("sign-up as application/json = %d %s; want 201", w.Code, w.Body)
	}
}
