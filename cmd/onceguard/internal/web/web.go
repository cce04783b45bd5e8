// Package web is the page the service serves at /: the first line of
// defence against duplicate submissions (docs/api.md).
//
// The page is four static files embedded in the binary (index.html,
// app.js, app.css, favicon.svg), plain JavaScript with no build step and no external
// resource. Sessions are the service's HttpOnly, SameSite=Strict cookie;
// the page never sees the token. Each money form fetches a one-time submit
// token when it is shown and after each completed submission and sends it
// as the Idempotency-Key; its button is disabled from the first click until
// the answer and for a quiet moment after it, and a retry after a network
// error reuses the same key, so no click pattern sends two keys for one
// intent. docs/browser.md says more.
package web

import (
	"bytes"
	"crypto/sha256"
	"embed"
	"encoding/base64"
	"net/http"
	"time"

	"github.com/onceguard/onceguard/idempotency"
)

//go:embed static
var static embed.FS

// ContentSecurityPolicy is sent with every answer of Handler: script,
// style, images and connections from the service's own origin only; no
// inline script or style, no eval, no plugins, no fonts, no base or form
// target elsewhere, and no framing (clickjacking). Trusted Types are
// required, so even a DOM sink the page does not use cannot take a string.
const ContentSecurityPolicy = "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self'; " +
	"connect-src 'self'; font-src 'none'; object-src 'none'; base-uri 'none'; form-action 'self'; " +
	"frame-ancestors 'none'; require-trusted-types-for 'script'"

// asset is one embedded file, ready to serve.
type asset struct {
	body        []byte
	contentType string
	etag        string
}

// paths maps each URL path the page answers to its embedded file.
var paths = map[string]struct{ file, contentType string }{
	"/":                   {"static/index.html", "text/html; charset=utf-8"},
	"/static/app.js":      {"static/app.js", "text/javascript; charset=utf-8"},
	"/static/app.css":     {"static/app.css", "text/css; charset=utf-8"},
	"/static/favicon.svg": {"static/favicon.svg", "image/svg+xml"},
}

// Handler serves the page at / and its assets under /static/, with the
// security headers (ContentSecurityPolicy, nosniff, no referrer, no
// framing) on every answer. Another path answers 404 not_found and another
// method than GET or HEAD 405 method_not_allowed, as problem+json like the
// API. It is safe for concurrent use.
func Handler() http.Handler {
	assets := make(map[string]asset, len(paths))
	for p, a := range paths {
		body, err := static.ReadFile(a.file)
		if err != nil {
			panic("web: embedded file missing: " + a.file) // a build mistake, caught by the tests
		}
		sum := sha256.Sum256(body)
		assets[p] = asset{body: body, contentType: a.contentType, etag: `"` + base64.RawURLEncoding.EncodeToString(sum[:12]) + `"`}
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Content-Security-Policy", ContentSecurityPolicy)
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Referrer-Policy", "no-referrer")
		h.Set("X-Frame-Options", "DENY")
		h.Set("Cross-Origin-Opener-Policy", "same-origin")
		h.Set("Cross-Origin-Resource-Policy", "same-origin")
		a, ok := assets[r.URL.Path]
		if !ok {
			idempotency.WriteProblem(w, &idempotency.Problem{Status: http.StatusNotFound, Code: "not_found", Title: "Not found", Detail: "no such resource"})
			return
		}
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			h.Set("Allow", "GET, HEAD")
			idempotency.WriteProblem(w, &idempotency.Problem{Status: http.StatusMethodNotAllowed, Code: "method_not_allowed", Title: "Method not allowed", Detail: r.Method + " is not allowed here"})
			return
		}
		h.Set("Content-Type", a.contentType)
		// Revalidate every time (cheap with the ETag): a new release's page
		// and script must never mix with an old one's.
		h.Set("Cache-Control", "no-cache")
		h.Set("ETag", a.etag)
		http.ServeContent(w, r, "", time.Time{}, bytes.NewReader(a.body))
	})
}
