package idempotency

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"time"

	"github.com/onceguard/onceguard/idempotency/idemstore"
)

// This file holds what adapters of a Guard to a framework share with
// Middleware: reading the body, buffering the handler's answer, writing
// problems, replays and first answers. An adapter whose framework has an
// http.ResponseWriter and an *http.Request (gin, echo, go-zero, kratos)
// uses them as they are; one on another HTTP stack (fiber, hertz) uses
// ProblemBody, ReplayHeader and FirstHeader with its own types.

// ReadBody reads r's body as Middleware does: up to limit+1 bytes, so
// that Guard.Begin can tell a body over the limit (413) from one at it.
func ReadBody(r *http.Request, limit int64) ([]byte, error) { return readBody(r, limit) }

// Body returns body as the handler's request body (an io.ReadCloser
// that is also an io.WriterTo), kept in the Call: no allocation of its
// own. An adapter sets it as the request's Body before the handler runs.
func (c *Call) Body(body []byte) io.ReadCloser {
	c.body.reset(body)
	return &c.body
}

// Recorder buffers a handler's answer for Guard.Finish: an
// http.ResponseWriter whose Flush does nothing (a streamed answer is
// stored whole, then sent whole). The zero Recorder is not ready: use
// NewRecorder.
type Recorder struct{ rec recorder }

// NewRecorder returns an empty Recorder: status 200, no header, no body.
func NewRecorder() *Recorder {
	return &Recorder{rec: recorder{header: make(http.Header), status: http.StatusOK}}
}

// Header returns the handler's header.
func (r *Recorder) Header() http.Header { return r.rec.header }

// WriteHeader records the first status written.
func (r *Recorder) WriteHeader(status int) { r.rec.WriteHeader(status) }

// Write appends p to the body (and records status 200 if none was).
func (r *Recorder) Write(p []byte) (int, error) { return r.rec.Write(p) }

// WriteString appends s to the body.
func (r *Recorder) WriteString(s string) (int, error) {
	r.rec.WriteHeader(http.StatusOK)
	return r.rec.body.WriteString(s)
}

// Flush does nothing: the answer is sent once it is stored.
func (r *Recorder) Flush() {}

// Status returns the status written so far (200 if none).
func (r *Recorder) Status() int { return r.rec.status }

// Written reports whether the handler wrote a status or a body.
func (r *Recorder) Written() bool { return r.rec.wroteHeader }

// Size returns the body's length so far.
func (r *Recorder) Size() int { return r.rec.body.Len() }

// Answer returns the recorded answer, for Guard.Finish. Its header and
// body are the Recorder's.
func (r *Recorder) Answer() Answer {
	return Answer{Status: r.rec.status, Header: r.rec.header, Body: r.rec.body.Bytes(), Written: r.rec.wroteHeader}
}

// WriteFirst sends the answer a to w, with what the Guard's options
// add to a first answer (FirstHeader); call it after Finish returned nil.
func (g *Guard[R]) WriteFirst(w http.ResponseWriter, a Answer, expires time.Time) {
	wh := w.Header()
	for k, v := range a.Header {
		wh[k] = v
	}
	g.FirstHeader(wh, expires)
	w.WriteHeader(a.Status)
	_, _ = w.Write(a.Body)
}

// WriteReplay writes the stored answer resp to w, with
// Idempotent-Replayed: true, Cache-Control: no-store and, when expires is
// set, Idempotency-Key-Expires.
func WriteReplay(w http.ResponseWriter, resp *idemstore.Response, expires time.Time) {
	replayHeader(w.Header(), resp, expires)
	w.WriteHeader(resp.Status)
	_, _ = w.Write(resp.Body)
}

// ProblemBody returns p's application/problem+json body, as WriteProblem
// writes it, and the headers that go with it (Content-Type, Cache-Control,
// Retry-After when set and the next submit token when the Guard offered
// one), for a transport that writes them itself.
func ProblemBody(p *Problem) (header http.Header, body []byte) {
	header = http.Header{"Content-Type": {"application/problem+json"}, "Cache-Control": {"no-store"}}
	if p.RetryAfter > 0 {
		header["Retry-After"] = []string{strconv.Itoa(p.RetryAfter)}
	}
	if p.next != "" {
		header[HeaderNextToken] = []string{p.next}
		header[HeaderNextTokenExpires] = []string{p.nextExpires}
	}
	var b bytes.Buffer
	_ = json.NewEncoder(&b).Encode(problemJSON(p))
	return header, b.Bytes()
}
