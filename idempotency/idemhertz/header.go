package idemhertz

import (
	"net/http"
	"sync"
)

// answerHeader collects a hertz response header, visited with
// VisitAll, as the http.Header of an idempotency.Answer: the values share
// one backing array, the usual names are not allocated, and the map is
// pooled (a Store copies what it keeps).
type answerHeader struct {
	h         http.Header
	first     http.Header // what FirstHeader adds, to set on the response
	vals      []string
	emptyBody bool // the body is empty: hertz's default Content-Type is not sent
}

var answerHeaders = sync.Pool{New: func() any {
	return &answerHeader{h: make(http.Header, 4), first: make(http.Header, 3), vals: make([]string, 0, 8)}
}}

func (a *answerHeader) recycle() {
	clear(a.h)
	clear(a.first)
	clear(a.vals)
	a.vals = a.vals[:0]
	answerHeaders.Put(a)
}

// visit is the VisitAll callback.
func (a *answerHeader) visit(k, v []byte) {
	key := headerName(k)
	switch {
	case key == "Content-Length":
		return
	case key == "Content-Type" && a.emptyBody && string(v) == defaultContentType:
		// hertz's default, which it does not send with an empty body:
		// not stored, so that a replay does not send it either.
		return
	}
	s := string(v)
	if old, ok := a.h[key]; ok { // a second value: rare (Set-Cookie)
		a.h[key] = append(old[:len(old):len(old)], s)
		return
	}
	a.vals = append(a.vals, s)
	n := len(a.vals)
	a.h[key] = a.vals[n-1 : n : n]
}

// headerName returns k canonical, without allocating for the usual names.
func headerName(k []byte) string {
	switch string(k) {
	case "Content-Type":
		return "Content-Type"
	case "Content-Length":
		return "Content-Length"
	case "Content-Language":
		return "Content-Language"
	case "Content-Encoding":
		return "Content-Encoding"
	case "Location":
		return "Location"
	case "Set-Cookie":
		return "Set-Cookie"
	case "Cache-Control":
		return "Cache-Control"
	case "Server":
		return "Server"
	case "Date":
		return "Date"
	case "Connection":
		return "Connection"
	case "Vary":
		return "Vary"
	case "Etag":
		return "Etag"
	case "Retry-After":
		return "Retry-After"
	}
	return http.CanonicalHeaderKey(string(k))
}
