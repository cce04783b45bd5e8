package gateway

import (
	"fmt"
	"strings"
)

// Route is one guarded route: a method, a path pattern whose {name}
// segments match any one non-empty segment, and an optional submit-token
// purpose.
type Route struct {
	Method  string
	Pattern string
	Purpose string

	segs []string // the pattern's segments; param for a {name} one
}

// param stands for a {name} segment in Route.segs: no literal holds a NUL.
const param = "\x00"

// ParseRoute parses "METHOD PATH [purpose]", as --route takes it:
// "POST /withdraw withdrawal", "POST /orders/{id}/pay payment".
func ParseRoute(s string) (Route, error) {
	f := strings.Fields(s)
	if len(f) < 2 || len(f) > 3 {
		return Route{}, fmt.Errorf("route %q: want \"METHOD PATH [purpose]\"", s)
	}
	r := Route{Method: f[0], Pattern: f[1]}
	if len(f) == 3 {
		r.Purpose = f[2]
		if !validPurpose(r.Purpose) {
			return Route{}, fmt.Errorf("route %q: purpose %q: want 1..32 letters, digits, '_' or '-'", s, r.Purpose)
		}
	}
	for _, c := range r.Method {
		if c < 'A' || c > 'Z' {
			return Route{}, fmt.Errorf("route %q: method %q: want upper-case letters (POST)", s, r.Method)
		}
	}
	if !strings.HasPrefix(r.Pattern, "/") {
		return Route{}, fmt.Errorf("route %q: path %q: want it to start with /", s, r.Pattern)
	}
	if ownPath(r.Pattern) {
		return Route{}, fmt.Errorf("route %q: %s is the gateway's own path", s, r.Pattern)
	}
	for _, seg := range strings.Split(r.Pattern[1:], "/") {
		switch {
		case strings.HasPrefix(seg, "{") && strings.HasSuffix(seg, "}") && len(seg) > 2:
			r.segs = append(r.segs, param)
		case strings.ContainsAny(seg, "{}"):
			return Route{}, fmt.Errorf("route %q: segment %q: want a literal or a whole {name}", s, seg)
		default:
			r.segs = append(r.segs, seg)
		}
	}
	return r, nil
}

func validPurpose(p string) bool {
	if len(p) == 0 || len(p) > 32 {
		return false
	}
	for _, c := range p {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

// String is the route as --route takes it.
func (r Route) String() string {
	s := r.Method + " " + r.Pattern
	if r.Purpose != "" {
		s += " " + r.Purpose
	}
	return s
}

// Match reports whether a request's method and (unescaped) path are this
// route's.
func (r *Route) Match(method, path string) bool {
	if method != r.Method || !strings.HasPrefix(path, "/") {
		return false
	}
	rest := path[1:]
	for i, seg := range r.segs {
		var part string
		if j := strings.IndexByte(rest, '/'); j >= 0 {
			if i == len(r.segs)-1 {
				return false // more segments than the pattern
			}
			part, rest = rest[:j], rest[j+1:]
		} else {
			if i != len(r.segs)-1 {
				return false // fewer
			}
			part, rest = rest, ""
		}
		if seg == param {
			if part == "" {
				return false
			}
		} else if part != seg {
			return false
		}
	}
	return true
}

// ownPath reports whether path is one the gateway answers itself, never
// proxied.
func ownPath(path string) bool {
	switch path {
	case "/healthz", "/readyz", "/metrics", "/onceguard":
		return true
	}
	return strings.HasPrefix(path, "/onceguard/")
}
