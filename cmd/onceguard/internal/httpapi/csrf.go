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

// csrfSafe tells whether a state-changing request may act on its session
// cookie: only same-origin and as JSON, which a cross-site form cannot send
// and a cross-site fetch cannot without a preflight this service never
// grants; Bearer requests carry no ambient credential and pass. Sign-ins
// and sign-ups must be same-origin, cookie or not (login CSRF, and sign-ups
// sent from a foreign page's visitors).
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

// requestScheme is the scheme the client used, when known: https on TLS,
// else X-Forwarded-Proto's first value or Forwarded's first proto. The
// headers are trusted for the origin check and the cookie only: a
// cross-site page cannot set them without a preflight.
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
