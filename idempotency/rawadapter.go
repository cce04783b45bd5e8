package idempotency

import (
	"bytes"
	"net/http"
	"strings"
	"sync"
	"time"
)

// This file holds what adapters on an HTTP stack without net/http's
// types (fiber and hertz, on fasthttp-style buffers) share on top of
// adapter.go: building the Request from the raw bytes of the stack's
// request, and collecting the handler's answer header, visited name by
// name, into the http.Header of an Answer without allocating for the
// usual names. What the stack itself does differently (a default
// Content-Type it does not send, how a header is set) stays in the
// adapter.

// RawRequest returns the Request for Begin from the raw parts of a
// request on such a stack: its method and path, the values of its
// Idempotency-Key header, its Content-Type and its body. It copies what
// the Guard may keep, since the stack reuses its buffers once the
// handler returns: the body up to MaxBody()+1 bytes (so that Begin can
// tell a body over the limit), the key values and the path; the usual
// methods are not allocated. The Content-Type is kept only when no key
// header was sent: the header wins over Options.KeyField.
func (g *Guard[R]) RawRequest(method, path []byte, keys [][]byte, contentType, body []byte) Request {
	b := bytes.Clone(body[:min(int64(len(body)), g.MaxBody()+1)])
	if b == nil {
		b = []byte{}
	}
	req := Request{Method: rawMethod(method), Path: string(path), Body: b}
	if len(keys) > 0 {
		req.Key = make([]string, len(keys))
		for i, v := range keys {
			req.Key[i] = string(v)
		}
	} else {
		req.ContentType = string(contentType)
	}
	return req
}

// rawMethod returns m as a string, without allocating for the usual ones.
func rawMethod(m []byte) string {
	switch string(m) {
	case http.MethodGet:
		return http.MethodGet
	case http.MethodPost:
		return http.MethodPost
	case http.MethodPut:
		return http.MethodPut
	case http.MethodPatch:
		return http.MethodPatch
	case http.MethodDelete:
		return http.MethodDelete
	}
	return strings.Clone(string(m))
}

// HeaderCollector collects a response header, given name by name (the
// callback of a VisitAll), as the http.Header of an Answer: the names
// are made canonical, the usual ones without allocating, the values
// share one backing array, and the collector comes from a pool (a Store
// copies what it keeps). Get one with NewHeaderCollector and Release it
// once the answer is stored and sent.
type HeaderCollector struct {
	h     http.Header
	first http.Header // what FirstHeader adds (FirstExtra)
	vals  []string
}

var headerCollectors = sync.Pool{New: func() any {
	return &HeaderCollector{h: make(http.Header, 4), first: make(http.Header, 3), vals: make([]string, 0, 8)}
}}

// NewHeaderCollector returns an empty HeaderCollector from the pool.
func NewHeaderCollector() *HeaderCollector {
	return headerCollectors.Get().(*HeaderCollector)
}

// Release empties c and puts it back in the pool: neither c nor the
// maps it returned may be used after.
func (c *HeaderCollector) Release() {
	clear(c.h)
	clear(c.first)
	clear(c.vals)
	c.vals = c.vals[:0]
	headerCollectors.Put(c)
}

// Add adds the header name: value, both copied. Content-Length is
// dropped: the length of the answer is its body's. A second value of a
// name (Set-Cookie) is appended to the first.
func (c *HeaderCollector) Add(name, value []byte) {
	canon := headerName(name)
	if canon == "Content-Length" {
		return
	}
	s := string(value)
	if old, ok := c.h[canon]; ok { // a second value: rare
		c.h[canon] = append(old[:len(old):len(old)], s)
		return
	}
	c.vals = append(c.vals, s)
	n := len(c.vals)
	c.h[canon] = c.vals[n-1 : n : n]
}

// Header returns the header collected so far; it is c's, valid until
// Release.
func (c *HeaderCollector) Header() http.Header { return c.h }

// Answer returns the Answer of status and body with the collected
// header, for Guard.Finish: Written unless it is a bare 200 with an
// empty body.
func (c *HeaderCollector) Answer(status int, body []byte) Answer {
	return Answer{Status: status, Header: c.h, Body: body, Written: status != http.StatusOK || len(body) > 0}
}

// FirstExtra returns what FirstHeader adds to the collected answer
// header and it does not have: the headers an adapter sets on a
// response that already holds the answer, once Finish returned nil (and
// the next submit token Finish added, Options.OfferToken). A
// Cache-Control of the handler's is kept, so it is not among them. The
// map is c's, valid until Release.
func (g *Guard[R]) FirstExtra(c *HeaderCollector, expires time.Time) http.Header {
	add := c.first
	cc, hadCC := c.h["Cache-Control"]
	if hadCC {
		add["Cache-Control"] = cc
	}
	g.FirstHeader(add, expires)
	if hadCC {
		delete(add, "Cache-Control")
	}
	// Finish added the offered token to the collected header only.
	for _, k := range [2]string{HeaderNextToken, HeaderNextTokenExpires} {
		if v, ok := c.h[k]; ok {
			add[k] = v
		}
	}
	return add
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
