package httpapi

import (
	"mime"
	"net/http"
	"net/url"
	"strings"
)

// csrfCheck answers 403 csrf_rejected to a request csrfSafe refuses.
func csrfCheck(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !csrfSafe(r) {
			writeProblem(w, problemFor("csrf_rejected",
				"a sign-up, a sign-in, or a request authenticated by the session cookie, must come from this origin (the latter sending application/json); or use Authorization: Bearer"))
			return
		}
		next.ServeHTTP(w, r)
	})
}

// jsonCheck answers 415 unsupported_media_type to a body not sent as JSON.
func jsonCheck(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !sendsJSON(r) {
			writeProblem(w, problemFor("unsupported_media_type", "a request body must be sent as Content-Type: application/json"))
			return
		}
		next.ServeHTTP(w, r)
	})
}

// csrfSafe tells whether a request may act on its session cookie. A
// state-changing request that carries the cookie and no Authorization
// header must be same-origin (Sec-Fetch-Site, and Origin's scheme and
// host, when the browser sends them) and JSON: a cross-site HTML form
// cannot send application/json, and a cross-site fetch that does needs a
// CORS preflight, which this service never grants. SameSite=Strict already
// keeps the cookie off cross-site requests; this is the second wall (for
// same-site subdomains and old browsers). Bearer requests carry no ambient
// credential and pass.
//
// Signing in sets the cookie, so a sign-in a browser sends from another
// site is refused too, cookie or not (login CSRF); so is a sign-up, which
// a foreign page could otherwise send from its visitors' addresses.
// Browsers name such a request's site (Sec-Fetch-Site) or origin (Origin,
// sent on every cross-origin POST); other clients send neither and pass.
func csrfSafe(r *http.Request) bool {
	switch r.Method {
	case http.MethodGet, http.MethodHead, http.MethodOptions:
		return true
	}
	if r.URL.Path == "/api/v1/sessions" || r.URL.Path == "/api/v1/users" {
		return sameOrigin(r)
	}
	if _, ok := bearer(r); ok {
		return true // the credential sessionToken uses; any other scheme falls back to the cookie
	}
	if _, err := r.Cookie(SessionCookie); err != nil {
		return true
	}
	ct := r.Header.Get("Content-Type")
	return sameOrigin(r) && (r.ContentLength == 0 && r.Method == http.MethodDelete || strings.HasPrefix(ct, "application/json"))
}

// sendsJSON tells whether a request that can carry a body sends it as
// application/json (parameters such as charset allowed); one with no body
// passes and meets the decoder's invalid_json instead.
func sendsJSON(r *http.Request) bool {
	switch r.Method {
	case http.MethodPost, http.MethodPut, http.MethodPatch:
	default:
		return true
	}
	ct := r.Header.Get("Content-Type")
	if ct == "" && r.ContentLength == 0 {
		return true
	}
	mt, _, err := mime.ParseMediaType(ct)
	return err == nil && mt == "application/json"
}

// sameOrigin tells whether a browser's request comes from this origin, as
// far as it says (Sec-Fetch-Site, and Origin's scheme and host).
func sameOrigin(r *http.Request) bool {
	switch r.Header.Get("Sec-Fetch-Site") {
	case "", "same-origin", "none":
	default:
		return false
	}
	if o := r.Header.Get("Origin"); o != "" {
		u, err := url.Parse(o)
		if err != nil || u.Host != r.Host {
			return false
		}
		if scheme, known := requestScheme(r); known && !strings.EqualFold(u.Scheme, scheme) {
			return false
		}
	}
	return true
}

// bearer returns the token of an Authorization: Bearer header (the scheme
// in any case, RFC 9110 section 11.1).
func bearer(r *http.Request) (string, bool) {
	scheme, tok, ok := strings.Cut(r.Header.Get("Authorization"), " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return "", false
	}
	return tok, true
}

// requestScheme is the scheme the client used, when it is known: https
// on a TLS connection, else what a TLS-terminating proxy in front says, in
// X-Forwarded-Proto (its first value) or in RFC 7239's Forwarded (the
// first element's proto). A proxy that says neither leaves it unknown,
// and then only the Origin's host is compared. The headers are trusted for
// this comparison and the cookie's Secure flag only: a cross-site page
// cannot set them without a CORS preflight, which this service never grants.
func requestScheme(r *http.Request) (scheme string, known bool) {
	if r.TLS != nil {
		return "https", true
	}
	p, _, _ := strings.Cut(r.Header.Get("X-Forwarded-Proto"), ",")
	if p = strings.ToLower(strings.TrimSpace(p)); p == "https" || p == "http" {
		return p, true
	}
	first, _, _ := strings.Cut(r.Header.Get("Forwarded"), ",")
	for _, pair := range strings.Split(first, ";") {
		k, v, _ := strings.Cut(strings.TrimSpace(pair), "=")
		if strings.EqualFold(k, "proto") {
			if v = strings.ToLower(strings.Trim(v, `"`)); v == "https" || v == "http" {
				return v, true
			}
		}
	}
	return "", false
}

// secure tells whether the client came over https, so that the session
// cookie is marked Secure (also behind a TLS-terminating proxy).
func secure(r *http.Request) bool {
	scheme, _ := requestScheme(r)
	return scheme == "https"
}
