package gateway

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/http/httputil"
	"strings"
	"sync/atomic"
	"time"

	"github.com/onceguard/onceguard/cmd/onceguard/internal/httpapi"
	"github.com/onceguard/onceguard/idempotency"
)

// MaxResponse is the largest upstream answer of a guarded request the
// gateway stores; a longer one is treated as no answer (its client
// cannot be given it, nor a replay of it).
const MaxResponse = 8 << 20

// NewTransport is the gateway's transport to the upstream: keep-alive,
// at most timeout to connect and to the first byte of an answer.
func NewTransport(timeout time.Duration) *http.Transport {
	return &http.Transport{
		Proxy:                 nil, // the upstream is addressed directly, whatever HTTP_PROXY says
		DialContext:           (&net.Dialer{Timeout: min(timeout, 10*time.Second), KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConns:          512,
		MaxIdleConnsPerHost:   256,
		IdleConnTimeout:       60 * time.Second,
		TLSHandshakeTimeout:   min(timeout, 10*time.Second),
		ResponseHeaderTimeout: timeout,
		ExpectContinueTimeout: time.Second,
	}
}

// hopHeaders are the hop-by-hop headers (RFC 9110 section 7.6.1), never
// forwarded in either direction; a Connection header names more.
var hopHeaders = []string{"Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate", "Proxy-Authorization",
	"Te", "Trailer", "Transfer-Encoding", "Upgrade"}

func removeHop(h http.Header) {
	for _, v := range h["Connection"] {
		for _, f := range strings.Split(v, ",") {
			if f = strings.TrimSpace(f); f != "" {
				h.Del(f)
			}
		}
	}
	for _, k := range hopHeaders {
		h.Del(k)
	}
}

// forward is step 7 of a guarded request: it sends the request to the
// upstream once and answers with the upstream's answer (stored by the
// middleware, whatever its status), 502 upstream_outcome_unknown (stored)
// when the upstream gave no whole answer after the request was sent, or
// 502 upstream_unavailable (the key freed: Forget) when it was never
// reached.
func (g *Gateway) forward(w http.ResponseWriter, r *http.Request, route string) {
	in := info(r)
	call, _ := idempotency.FromContext(r.Context())
	if call == nil { // cannot happen: the middleware always has a key here
		g.unavailable(w, in, nil, "no key")
		return
	}
	if call.Recovered {
		// The key's first request was in flight on a gateway that stopped
		// (crashed, killed) before it stored an answer: it may have been
		// forwarded and acted on. Never again.
		in.outcome = "upstream_outcome_unknown"
		g.metrics.Upstream.WithLabelValues(route, "recovered_unknown").Observe(0)
		writeUnknown(w, "the gateway that held this request stopped before the upstream's answer was stored; the upstream may have acted on it")
		return
	}
	body, _ := io.ReadAll(r.Body) // the middleware's buffer: cannot fail

	// The client going away must not cut the upstream off mid-request: the
	// outcome would become unknown for no reason. The upstream timeout
	// bounds it instead.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), g.cfg.UpstreamTimeout)
	defer cancel()
	var connected atomic.Bool
	ctx = httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{GotConn: func(httptrace.GotConnInfo) { connected.Store(true) }})
	out, err := http.NewRequestWithContext(ctx, r.Method, g.target(r), bytes.NewReader(body))
	if err != nil {
		g.unavailable(w, in, call, "the request could not be built: "+err.Error())
		return
	}
	out.Header = g.outHeader(r)
	// net/http's Transport re-sends a request on a fresh connection when a
	// reused one broke after it was written, if the request is
	// "replayable", which a request with an Idempotency-Key header is
	// (golang.org/issue/19943). The upstream may have acted on the first
	// copy: the key goes in under a non-canonical spelling (header names
	// are case-insensitive on the wire), so the Transport does not see it
	// and re-sends only what it never wrote (its nothing-written retry,
	// which GetBody allows).
	out.Header["idempotency-key"] = []string{call.Key}
	out.ContentLength = int64(len(body))
	switch out.Method {
	case "GET", "HEAD", "OPTIONS", "TRACE":
		// These the Transport re-sends after a written request's kept-alive
		// connection broke whatever their headers: a body it cannot rewind
		// (no GetBody) makes them not replayable. (An empty one is probed,
		// found empty and not sent.)
		out.Body, out.GetBody = io.NopCloser(bytes.NewReader(body)), nil
	}
	start := time.Now()
	resp, err := g.cfg.Transport.RoundTrip(out)
	if err != nil {
		if neverSent(err, connected.Load()) {
			g.metrics.Upstream.WithLabelValues(route, "unavailable").Observe(time.Since(start).Seconds())
			g.unavailable(w, in, call, err.Error())
			return
		}
		g.metrics.Upstream.WithLabelValues(route, "outcome_unknown").Observe(time.Since(start).Seconds())
		g.log.Warn("upstream gave no answer: the key's outcome is unknown", "route", route, "err", err.Error())
		in.outcome = "upstream_outcome_unknown"
		writeUnknown(w, "the upstream gave no answer ("+describe(err)+") after the request was sent; it may have acted on it")
		return
	}
	defer resp.Body.Close()
	answer, err := io.ReadAll(io.LimitReader(resp.Body, MaxResponse+1))
	if err == nil && len(answer) > MaxResponse {
		err = fmt.Errorf("the answer is over %d bytes", MaxResponse)
	}
	if err != nil {
		g.metrics.Upstream.WithLabelValues(route, "outcome_unknown").Observe(time.Since(start).Seconds())
		g.log.Warn("upstream answer cut short: the key's outcome is unknown", "route", route, "status", resp.StatusCode, "err", err.Error())
		in.outcome = "upstream_outcome_unknown"
		writeUnknown(w, fmt.Sprintf("the upstream's answer (status %d) broke off (%s); it may have acted on the request", resp.StatusCode, describe(err)))
		return
	}
	g.metrics.Upstream.WithLabelValues(route, "answered").Observe(time.Since(start).Seconds())
	in.outcome = "forwarded"
	h := w.Header()
	removeHop(resp.Header)
	for k, v := range resp.Header {
		h[k] = v
	}
	delete(h, "Content-Length") // net/http sets it from the body
	w.WriteHeader(resp.StatusCode)
	_, _ = w.Write(answer)
}

// neverSent reports whether a round trip's error means the request
// never reached the upstream: no connection was had (refused, DNS, TLS,
// a dial that timed out), or the last attempt failed dialling. Anything
// else may have been read by the upstream.
func neverSent(err error, connected bool) bool {
	if !connected {
		return true
	}
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "dial" {
		return true
	}
	var dns *net.DNSError
	var cert *tls.CertificateVerificationError
	var unknownCA x509.UnknownAuthorityError
	var rec tls.RecordHeaderError
	return errors.As(err, &dns) || errors.As(err, &cert) || errors.As(err, &unknownCA) || errors.As(err, &rec)
}

// describe names an upstream error without its addresses.
func describe(err error) string {
	var ne net.Error
	switch {
	case errors.Is(err, context.DeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout()):
		return "timed out"
	case errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF):
		return "connection closed"
	}
	var op *net.OpError
	if errors.As(err, &op) && op.Err != nil {
		return op.Op + ": " + op.Err.Error()
	}
	return "connection broken"
}

func writeUnknown(w http.ResponseWriter, detail string) {
	idempotency.WriteProblem(w, &idempotency.Problem{Status: http.StatusBadGateway, Code: "upstream_outcome_unknown", Title: "Upstream outcome unknown",
		Detail: detail + ". This key will answer the same; check the upstream's records, and send the request again under a new key only if it did not happen"})
}

// unavailable answers 502 upstream_unavailable and frees the key: the
// request never reached the upstream, so the same key may be sent again.
func (g *Gateway) unavailable(w http.ResponseWriter, in *reqInfo, call *idempotency.Call, why string) {
	if call != nil {
		call.Forget()
	}
	in.outcome = "upstream_unavailable"
	g.log.Warn("upstream unreachable", "err", why)
	idempotency.WriteProblem(w, &idempotency.Problem{Status: http.StatusBadGateway, Code: "upstream_unavailable", Title: "Upstream unavailable",
		Detail: "the upstream could not be reached, so the request was not sent; retry with the same key", RetryAfter: 1})
}

// target is the upstream URL of r: the upstream's scheme and host, its
// path prefix, r's path and query.
func (g *Gateway) target(r *http.Request) string {
	u := *g.cfg.Upstream
	u.Path = strings.TrimSuffix(u.Path, "/") + r.URL.Path
	if r.URL.RawPath != "" {
		u.RawPath = strings.TrimSuffix(u.EscapedPath(), "/") + r.URL.RawPath
	} else {
		u.RawPath = ""
	}
	u.RawQuery = r.URL.RawQuery
	return u.String()
}

// outHeader is r's header as the upstream gets it: without hop-by-hop
// headers and the client's own Idempotency-Key spellings, with
// X-Forwarded-For (the client's address appended, as nginx's
// $proxy_add_x_forwarded_for), X-Forwarded-Host and X-Forwarded-Proto.
func (g *Gateway) outHeader(r *http.Request) http.Header {
	h := r.Header.Clone()
	if h == nil {
		h = http.Header{}
	}
	removeHop(h)
	for k := range h {
		if strings.EqualFold(k, "Idempotency-Key") || strings.EqualFold(k, "X-Idempotency-Key") {
			delete(h, k)
		}
	}
	setForwarded(h, r)
	return h
}

func setForwarded(h http.Header, r *http.Request) {
	if ip, _, err := net.SplitHostPort(r.RemoteAddr); err == nil {
		if prior := h.Values("X-Forwarded-For"); len(prior) > 0 {
			ip = strings.Join(prior, ", ") + ", " + ip
		}
		h.Set("X-Forwarded-For", ip)
	}
	h.Set("X-Forwarded-Host", r.Host)
	proto := "http"
	if r.TLS != nil {
		proto = "https"
	}
	h.Set("X-Forwarded-Proto", proto)
}

// passThrough is the reverse proxy of every request that is not guarded:
// bodies streamed both ways without a limit, websockets and other
// upgrades passed through, the same forwarding headers.
func (g *Gateway) passThrough() http.Handler {
	up := g.cfg.Upstream
	return &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(up)
			pr.Out.Header["X-Forwarded-For"] = pr.In.Header["X-Forwarded-For"]
			pr.SetXForwarded()
		},
		Transport:     g.cfg.Transport,
		FlushInterval: 100 * time.Millisecond,
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			in := info(r)
			in.outcome = "upstream_error"
			if errors.Is(err, context.Canceled) && r.Context().Err() != nil {
				in.outcome = "client_gone"
				return
			}
			g.log.Warn("proxying failed", "err", err.Error())
			idempotency.WriteProblem(w, &idempotency.Problem{Status: http.StatusBadGateway, Code: "upstream_unavailable", Title: "Upstream unavailable",
				Detail: "the upstream did not answer: " + describe(err)})
		},
		ErrorLog: nil,
	}
}

// readyz reports each component as the service's /readyz does: 503
// unavailable without the database, 200 degraded when another component
// (the upstream, Redis, the locks) is not ok, else 200 ok.
func (g *Gateway) readyz(w http.ResponseWriter, r *http.Request) {
	checks := append([]httpapi.Component{{Name: "upstream", Check: g.upstreamStatus}}, g.cfg.Components...)
	httpapi.WriteReadiness(w, r, g.cfg.Ping, checks)
}

// upstreamStatus is "ok" when the upstream accepts a connection.
func (g *Gateway) upstreamStatus(ctx context.Context) (string, bool) {
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", g.upstream)
	if err != nil {
		return "unreachable", false
	}
	_ = c.Close()
	return "ok", true
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}
