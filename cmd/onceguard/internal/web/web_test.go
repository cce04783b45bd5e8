package web_test

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"

	"github.com/onceguard/onceguard/cmd/onceguard/internal/web"
)

func get(t *testing.T, h http.Handler, method, path string, header http.Header) *http.Response {
	t.Helper()
	req := httptest.NewRequest(method, path, nil)
	for k, v := range header {
		req.Header[k] = v
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec.Result()
}

func body(t *testing.T, resp *http.Response) string {
	t.Helper()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// Every answer carries the security headers, whatever its status.
func TestSecurityHeaders(t *testing.T) {
	h := web.Handler()
	for _, tc := range []struct{ method, path string }{
		{"GET", "/"}, {"GET", "/static/app.js"}, {"GET", "/nope"}, {"POST", "/"},
	} {
		t.Run(tc.method+" "+tc.path, func(t *testing.T) {
			resp := get(t, h, tc.method, tc.path, nil)
			csp := resp.Header.Get("Content-Security-Policy")
			for _, want := range []string{"default-src 'self'", "script-src 'self'", "frame-ancestors 'none'", "object-src 'none'", "base-uri 'none'"} {
				if !strings.Contains(csp, want) {
					t.Errorf("Content-Security-Policy = %q; want it to contain %q", csp, want)
				}
			}
			if strings.Contains(csp, "unsafe-") {
				t.Errorf("Content-Security-Policy = %q; want no unsafe-inline or unsafe-eval", csp)
			}
			for name, want := range map[string]string{
				"X-Content-Type-Options": "nosniff",
				"Referrer-Policy":        "no-referrer",
				"X-Frame-Options":        "DENY",
			} {
				if got := resp.Header.Get(name); got != want {
					t.Errorf("%s = %q; want %q", name, got, want)
				}
			}
		})
	}
}

func TestAssets(t *testing.T) {
	h := web.Handler()
	for _, tc := range []struct{ path, contentType, contains string }{
		{"/", "text/html; charset=utf-8", `<script src="/static/app.js" defer></script>`},
		{"/static/app.js", "text/javascript; charset=utf-8", "Idempotency-Key"},
		{"/static/app.css", "text/css; charset=utf-8", "@media"},
		{"/static/favicon.svg", "image/svg+xml", "<svg"},
	} {
		t.Run(tc.path, func(t *testing.T) {
			resp := get(t, h, "GET", tc.path, nil)
			b := body(t, resp)
			if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != tc.contentType {
				t.Fatalf("GET %s = %d %q; want 200 %q", tc.path, resp.StatusCode, resp.Header.Get("Content-Type"), tc.contentType)
			}
			if !strings.Contains(b, tc.contains) {
				t.Errorf("GET %s body lacks %q", tc.path, tc.contains)
			}
			if resp.Header.Get("Cache-Control") != "no-cache" || resp.Header.Get("ETag") == "" {
				t.Errorf("GET %s: Cache-Control %q, ETag %q; want no-cache and an ETag", tc.path, resp.Header.Get("Cache-Control"), resp.Header.Get("ETag"))
			}
			again := get(t, h, "GET", tc.path, http.Header{"If-None-Match": {resp.Header.Get("ETag")}})
			if again.StatusCode != http.StatusNotModified {
				t.Errorf("GET %s with its ETag = %d; want 304", tc.path, again.StatusCode)
			}
			head := get(t, h, "HEAD", tc.path, nil)
			if head.StatusCode != 200 || body(t, head) != "" {
				t.Errorf("HEAD %s = %d; want 200 and no body", tc.path, head.StatusCode)
			}
		})
	}
}

// Unknown paths and methods answer like the API: problem+json with a code.
func TestProblems(t *testing.T) {
	h := web.Handler()
	for _, tc := range []struct {
		method, path string
		status       int
		code         string
	}{
		{"GET", "/nope", 404, "not_found"},
		{"GET", "/static/", 404, "not_found"},
		{"GET", "/static/../web.go", 404, "not_found"},
		{"POST", "/", 405, "method_not_allowed"},
		{"DELETE", "/static/app.js", 405, "method_not_allowed"},
	} {
		t.Run(tc.method+" "+tc.path, func(t *testing.T) {
			resp := get(t, h, tc.method, tc.path, nil)
			var p struct{ Code string }
			_ = json.Unmarshal([]byte(body(t, resp)), &p)
			if resp.StatusCode != tc.status || p.Code != tc.code || resp.Header.Get("Content-Type") != "application/problem+json" {
				t.Errorf("%s %s = %d %q (%s); want %d %q as problem+json", tc.method, tc.path, resp.StatusCode, p.Code, resp.Header.Get("Content-Type"), tc.status, tc.code)
			}
		})
	}
	if got := get(t, h, "POST", "/", nil).Header.Get("Allow"); got != "GET, HEAD" {
		t.Errorf("Allow = %q; want %q", got, "GET, HEAD")
	}
}

// The page works under its own policy: no inline script, no inline
// handlers or styles, no resource from another origin, and no DOM sink that
// Trusted Types would refuse.
func TestNoInlineOrExternal(t *testing.T) {
	h := web.Handler()
	html := body(t, get(t, h, "GET", "/", nil))
	for _, tag := range regexp.MustCompile(`(?is)<script\b[^>]*>(.*?)</script>`).FindAllStringSubmatch(html, -1) {
		if !strings.Contains(tag[0], `src="/static/`) || strings.TrimSpace(tag[1]) != "" {
			t.Errorf("index.html has an inline script: %s", tag[0])
		}
	}
	if m := regexp.MustCompile(`(?i)\s(on[a-z]+|style)\s*=`).FindString(html); m != "" {
		t.Errorf("index.html has an inline handler or style attribute: %q", m)
	}
	if m := regexp.MustCompile(`(?i)<style\b`).FindString(html); m != "" {
		t.Errorf("index.html has an inline <style>")
	}
	for _, p := range []string{"/", "/static/app.js", "/static/app.css"} {
		b := body(t, get(t, h, "GET", p, nil))
		if m := regexp.MustCompile(`(?i)(https?:)?//[a-z0-9.-]+\.[a-z]{2,}`).FindString(b); m != "" {
			t.Errorf("%s refers to another origin: %q", p, m)
		}
		if m := regexp.MustCompile(`(?i)@import|@font-face|innerHTML|outerHTML|insertAdjacentHTML|document\.write|\beval\(|new Function`).FindString(b); m != "" {
			t.Errorf("%s uses %q", p, m)
		}
	}
	js := body(t, get(t, h, "GET", "/static/app.js", nil))
	if !strings.Contains(js, "localStorage.setItem(HINT, '1')") || regexp.MustCompile(`localStorage\.setItem\([^)]*token`).MatchString(js) {
		t.Errorf("app.js: want only the signed-in hint in localStorage, never a token")
	}
}
