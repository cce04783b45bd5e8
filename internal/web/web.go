// Package web is the page the service serves at /: the first line of
// defence against duplicate submissions (shared/api.md, issue 6).
package web

import "net/http"

// Handler serves the page and its assets. Placeholder until the page lands.
func Handler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.NotFound(w, r)
	})
}
