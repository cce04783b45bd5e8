package httpapi

import (
	"net/http"
	"regexp"
	"sort"
	"strings"
)

// idRE is what an id in a path may be: ours are lowercase, so another spelling names nothing on every database.
var idRE = regexp.MustCompile(`^[a-z0-9_-]{1,64}$`)

// handle registers h for method on path ({id} matches one id), behind the route checks.
func (s *server) handle(method, path string, h http.Handler) {
	if s.routes[path] == nil {
		s.routes[path] = map[string]http.Handler{}
	}
	s.routes[path][method] = chain(h, csrfCheck, jsonCheck)
}

// resolve finds r's route and notes its pattern (the metric label: "web" for the page,
// "unmatched" for 404s) and handler: the route's, the page, 404 not_found or 405 method_not_allowed.
func (s *server) resolve(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		in := info(r)
		pattern := r.URL.Path
		methods, ok := s.routes[pattern]
		if !ok {
			methods, pattern, ok = s.match(r)
		}
		switch {
		case !ok && s.cfg.Web != nil && (r.URL.Path == "/" || strings.HasPrefix(r.URL.Path, "/static/")):
			in.route, in.target = "web", s.cfg.Web
		case !ok:
			in.route, in.target = "unmatched", http.HandlerFunc(notFound)
		default:
			in.route = pattern
			h, found := methods[r.Method]
			if !found && r.Method == http.MethodHead { // RFC 9110 section 9.3.2: GET's answer without its body
				h, found = methods[http.MethodGet]
			}
			if !found {
				h = methodNotAllowed(methods)
			}
			in.target = h
		}
		next.ServeHTTP(w, r)
	})
}

// dispatch serves what resolve found.
func (s *server) dispatch(w http.ResponseWriter, r *http.Request) { info(r).target.ServeHTTP(w, r) }

func notFound(w http.ResponseWriter, _ *http.Request) {
	writeProblem(w, problemFor("not_found", "no such resource"))
}

// methodNotAllowed answers 405 with the route's methods in Allow.
func methodNotAllowed(methods map[string]http.Handler) http.Handler {
	allow := make([]string, 0, len(methods)+1)
	for m := range methods {
		allow = append(allow, m)
		if m == http.MethodGet {
			allow = append(allow, http.MethodHead)
		}
	}
	sort.Strings(allow)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Allow", strings.Join(allow, ", "))
		writeProblem(w, problemFor("method_not_allowed", r.Method+" is not allowed here"))
	})
}

// match resolves the paths with an id: /api/v1/{orders,deposits,withdrawals}/{id} and
// /api/v1/orders/{id}/payment.
func (s *server) match(r *http.Request) (map[string]http.Handler, string, bool) {
	rest, ok := strings.CutPrefix(r.URL.Path, "/api/v1/")
	if !ok {
		return nil, "", false
	}
	parts := strings.Split(rest, "/")
	if len(parts) < 2 || len(parts) > 3 || !idRE.MatchString(parts[1]) {
		return nil, "", false // ids are ours: anything else names nothing
	}
	pattern := "/api/v1/" + parts[0] + "/{id}"
	if len(parts) == 3 {
		pattern += "/" + parts[2]
	}
	m, ok := s.routes[pattern]
	if ok {
		r.SetPathValue("id", parts[1])
	}
	return m, pattern, ok
}
