package main

import (
	"io"
	"net/http"
	"strings"
	"testing"
)

// A request that acts on the session cookie must be same-origin and JSON;
// Bearer requests are not subject to it.
func TestServeCSRF(t *testing.T) {
	base := startServe(t)
	alice := signUp(t, base, "alice")
	send := func(auth, origin, site, ctype, proto, key string) (int, string) {
		req, _ := http.NewRequest("POST", base+"/api/v1/deposits", strings.NewReader(`{"amount":"1.00"}`))
		if auth == "cookie" {
			req.AddCookie(&http.Cookie{Name: "onceguard_session", Value: alice.token})
		} else {
			req.Header.Set("Authorization", "Bearer "+alice.token)
		}
		fwd := ""
		if p, ok := strings.CutPrefix(proto, "fwd:"); ok { // RFC 7239 instead of X-Forwarded-Proto
			proto, fwd = "", `for=192.0.2.1;proto="`+p+`";host=`+strings.TrimPrefix(base, "http://")
		}
		for k, v := range map[string]string{"Origin": origin, "Sec-Fetch-Site": site, "Content-Type": ctype, "X-Forwarded-Proto": proto, "Forwarded": fwd, "Idempotency-Key": key} {
			if v != "" {
				req.Header.Set(k, v)
			}
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	host := strings.TrimPrefix(base, "http://")
	for _, tc := range []struct {
		name, auth, origin, site, ctype, proto string
		status                                 int
	}{
		{"cookie from another origin", "cookie", "http://evil.example", "", "application/json", "", 403},
		{"cookie, cross-site fetch", "cookie", "", "cross-site", "application/json", "", 403},
		{"cookie, same-site subdomain", "cookie", "", "same-site", "application/json", "", 403},
		{"cookie, form content type", "cookie", "http://" + host, "same-origin", "text/plain", "", 403},
		{"cookie, same origin, JSON", "cookie", "http://" + host, "same-origin", "application/json", "", 201},
		{"cookie, no browser headers, JSON", "cookie", "", "", "application/json", "", 201},
		{"bearer from anywhere", "bearer", "http://evil.example", "cross-site", "application/json", "", 201},
		{"bearer, form content type", "bearer", "", "", "text/plain", "", 415},
		// The origin is scheme and host. Where the scheme is known (TLS,
		// or a proxy's X-Forwarded-Proto or Forwarded) it must match;
		// where a proxy says nothing, only the host is compared, so that
		// a browser behind a TLS proxy that sends no header still works.
		{"cookie, https origin, scheme not known", "cookie", "https://" + host, "", "application/json", "", 201},
		{"cookie, https origin over plain http", "cookie", "https://" + host, "", "application/json", "http", 403},
		{"cookie, http origin, Forwarded proto=https", "cookie", "http://" + host, "", "application/json", "fwd:https", 403},
		{"cookie, https origin, Forwarded proto=https", "cookie", "https://" + host, "", "application/json", "fwd:https", 201},
		{"cookie, http origin behind a TLS proxy", "cookie", "http://" + host, "", "application/json", "https", 403},
		{"cookie, https origin behind a TLS proxy", "cookie", "https://" + host, "", "application/json", "https", 201},
	} {
		t.Run(tc.name, func(t *testing.T) {
			status, body := send(tc.auth, tc.origin, tc.site, tc.ctype, tc.proto, "k-"+strings.NewReplacer(" ", "-", ",", "").Replace(tc.name))
			if status != tc.status || (status == 403 && !strings.Contains(body, `"code":"csrf_rejected"`)) || (status == 415 && !strings.Contains(body, `"code":"unsupported_media_type"`)) {
				t.Errorf("= %d %s; want %d", status, body, tc.status)
			}
		})
	}
	if a := alice.do("GET", "/api/v1/account", "", ""); a.body["balance"] != "6.00" {
		t.Errorf("balance = %v; want 6.00 (only the six allowed deposits)", a.body["balance"])
	}
}
