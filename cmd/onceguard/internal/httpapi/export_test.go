package httpapi

import (
	"net/http"
	"sort"
)

// Routes returns "METHOD pattern" for every route of h, a handler from New, sorted: for tests
// that must cover every route, the ones added later too.
func Routes(h http.Handler) []string {
	var out []string
	for path, methods := range h.(*server).routes {
		for method := range methods {
			out = append(out, method+" "+path)
		}
	}
	sort.Strings(out)
	return out
}
