// Package gateway is `onceguard gateway` (docs/gateway.md): a reverse
// proxy that puts the duplicate protection of docs/api.md in front of an
// HTTP service in any language. Guarded routes run through the library's
// idempotency.Middleware, on the service's own stores; the handler it
// wraps forwards the request once and tells an upstream that answered
// (its answer is stored, 5xx included) from one that gave no answer
// (502 upstream_outcome_unknown, stored: the key is never forwarded
// again) and one that was never reached (502 upstream_unavailable, the
// key freed). Every other request is proxied untouched.
package gateway

import (
	"context"
	"crypto/sha256"
	_ "embed"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"path"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/onceguard/onceguard/cmd/onceguard/internal/httpapi"
	"github.com/onceguard/onceguard/idempotency"
	"github.com/onceguard/onceguard/idempotency/idemstore"
	"github.com/onceguard/onceguard/token"
)

// MaxBody is the largest body of a guarded request (413 body_too_large
// above); other routes stream bodies of any size.
const MaxBody = idempotency.DefaultMaxBody

// Config wires a Gateway. Upstream, Routes, Keys and one of
// PrincipalHeader and PrincipalCookie are required.
type Config struct {
	Upstream *url.URL            // where every request is proxied
	Routes   []Route             // the guarded routes
	Keys     idemstore.FullStore // key records, submit tokens and (without Windows) the window
	Windows  idemstore.WindowStore

	RequireToken    map[string]bool // purposes whose routes accept only submit tokens
	PrincipalHeader string          // a header a trusted proxy sets to the user
	PrincipalCookie string          // the upstream's session cookie, used hashed
	KeyField        string          // a body field carrying the key when there is no header

	Window          time.Duration // repeat-submit window; 0 off
	KeyTTL          time.Duration // default idempotency.DefaultTTL
	KeyLease        time.Duration // must outlast UpstreamTimeout
	TokenTTL        time.Duration // default token.DefaultTTL
	UpstreamTimeout time.Duration // a guarded request's whole upstream exchange; default 30s

	Ping       func(context.Context) error // the database, for /readyz
	Components []httpapi.Component         // more /readyz components (Redis, locks)
	Transport  http.RoundTripper           // to the upstream; nil: NewTransport(UpstreamTimeout)
	Metrics    *Metrics                    // nil: NewMetrics()
	Logger     *slog.Logger                // nil: none
}

// DefaultUpstreamTimeout is Config.UpstreamTimeout's default.
const DefaultUpstreamTimeout = 30 * time.Second

// Gateway is the gateway's http.Handler.
type Gateway struct {
	cfg      Config
	guarded  []http.Handler // one per cfg.Routes
	proxy    http.Handler   // the pass-through reverse proxy
	tokens   *token.Tokens
	purposes map[string]bool
	metrics  *Metrics
	log      *slog.Logger
	upstream string // host:port, for /readyz
}

// New checks cfg and returns its Gateway.
func New(cfg Config) (*Gateway, error) {
	switch {
	case cfg.Upstream == nil || (cfg.Upstream.Scheme != "http" && cfg.Upstream.Scheme != "https") || cfg.Upstream.Host == "":
		return nil, errors.New("gateway: the upstream must be an http:// or https:// URL with a host")
	case cfg.Keys == nil:
		return nil, errors.New("gateway: no key store")
	case (cfg.PrincipalHeader == "") == (cfg.PrincipalCookie == ""):
		return nil, errors.New("gateway: name exactly one of a principal header and a principal cookie")
	}
	if cfg.Windows == nil {
		cfg.Windows = cfg.Keys
	}
	if cfg.UpstreamTimeout <= 0 {
		cfg.UpstreamTimeout = DefaultUpstreamTimeout
	}
	if cfg.KeyLease <= 0 {
		cfg.KeyLease = DefaultLease(cfg.UpstreamTimeout)
	}
	if !FitsLease(cfg.UpstreamTimeout, cfg.KeyLease) {
		return nil, fmt.Errorf("gateway: key lease %v must outlast the upstream timeout %v by a quarter of it: a slow upstream would see the key forwarded twice", cfg.KeyLease, cfg.UpstreamTimeout)
	}
	if cfg.Transport == nil {
		cfg.Transport = NewTransport(cfg.UpstreamTimeout)
	}
	if cfg.Metrics == nil {
		cfg.Metrics = NewMetrics()
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	g := &Gateway{cfg: cfg, metrics: cfg.Metrics, log: cfg.Logger, purposes: map[string]bool{},
		tokens: token.New(cfg.Keys, &token.Options{TTL: cfg.TokenTTL})}
	g.upstream = cfg.Upstream.Host
	if cfg.Upstream.Port() == "" {
		g.upstream += map[string]string{"http": ":80", "https": ":443"}[cfg.Upstream.Scheme]
	}
	for p := range cfg.RequireToken {
		if cfg.RequireToken[p] && !slices.ContainsFunc(cfg.Routes, func(r Route) bool { return r.Purpose == p }) {
			return nil, fmt.Errorf("gateway: submit tokens required for %q, but no route has that purpose", p)
		}
	}
	for i := range cfg.Routes {
		r := &cfg.Routes[i]
		if r.segs == nil {
			parsed, err := ParseRoute(r.String())
			if err != nil {
				return nil, err
			}
			*r = parsed
		}
		if r.Purpose != "" {
			g.purposes[r.Purpose] = true
		}
		g.guarded = append(g.guarded, g.guard(r))
	}
	g.proxy = g.passThrough()
	return g, nil
}

// DefaultLease is the key lease for an upstream timeout: twice it.
func DefaultLease(upstreamTimeout time.Duration) time.Duration { return 2 * upstreamTimeout }

// FitsLease reports whether a key lease outlasts a guarded request: the
// upstream timeout and a quarter of it more to store the answer. A lease
// that ran out while the upstream still worked would let a retry take
// the key over.
func FitsLease(upstreamTimeout, lease time.Duration) bool {
	return upstreamTimeout+upstreamTimeout/4 < lease
}

// guard returns the handler of one guarded route: the library's
// middleware around the forward.
func (g *Gateway) guard(r *Route) http.Handler {
	c := g.cfg
	var tokens *token.Tokens
	if r.Purpose != "" {
		tokens = g.tokens
	}
	mw := idempotency.Middleware(idempotency.Config{
		Store: c.Keys, Tokens: tokens, Purpose: r.Purpose, RequireToken: c.RequireToken[r.Purpose],
		Windows: c.Windows, Window: c.Window, TTL: c.KeyTTL, Lease: c.KeyLease, MaxBody: MaxBody,
		Principal: g.principal,
		KeyField:  c.KeyField,
		Fingerprint: func(req *http.Request, body []byte) (string, error) {
			fp, err := Fingerprint(req.Header.Get("Content-Type"), body, c.KeyField)
			if err != nil || req.URL.RawQuery == "" {
				return fp, err
			}
			// The query is forwarded and acted on (pay.php?order=7): part
			// of the request, in any order of its fields.
			q := req.URL.RawQuery
			if v, err := url.ParseQuery(q); err == nil {
				q = v.Encode()
			}
			return digest("query", []byte(q+"\x00"+fp)), nil
		},
		ReplayHeaders:     []string{"*"},
		StoreServerErrors: true, // at most once: the upstream may have acted before its 5xx
		OnEvent:           g.keyEvent,
	})
	route := r.String()
	return mw(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) { g.forward(w, req, route) }))
}

// principal is who is asking: the principal header's value, or the hash
// of the principal cookie's (a session id is a secret: it is never
// stored). None: 401 unauthenticated.
func (g *Gateway) principal(r *http.Request) (string, error) {
	if h := g.cfg.PrincipalHeader; h != "" {
		if vs := r.Header.Values(h); len(vs) > 1 {
			// A proxy that appended its value to the client's: whose keys
			// they are is not known.
			return "", &idempotency.Problem{Status: http.StatusUnauthorized, Code: "unauthenticated", Title: "Authentication required",
				Detail: "the request carries more than one " + h + " header"}
		} else if len(vs) == 1 && vs[0] != "" {
			return HeaderPrincipal(vs[0]), nil
		}
		return "", &idempotency.Problem{Status: http.StatusUnauthorized, Code: "unauthenticated", Title: "Authentication required",
			Detail: "the request carries no " + h + " header"}
	}
	if c, err := r.Cookie(g.cfg.PrincipalCookie); err == nil && c.Value != "" {
		return CookiePrincipal(c.Value), nil
	}
	return "", &idempotency.Problem{Status: http.StatusUnauthorized, Code: "unauthenticated", Title: "Authentication required",
		Detail: "the request carries no " + g.cfg.PrincipalCookie + " cookie: sign in first"}
}

// HeaderPrincipal is the principal of a request whose principal header
// has the value v: v itself.
func HeaderPrincipal(v string) string { return v }

// CookiePrincipal is the principal of a request whose principal cookie
// has the value v: its SHA-256, so that no session id is stored.
func CookiePrincipal(v string) string {
	sum := sha256.Sum256([]byte(v))
	return "cookie:" + hex.EncodeToString(sum[:])
}

// reqInfo is what one request's handlers learn, for its metrics and log line.
type reqInfo struct {
	route, outcome string
}

type infoKey struct{}

func info(r *http.Request) *reqInfo {
	if i, ok := r.Context().Value(infoKey{}).(*reqInfo); ok {
		return i
	}
	return &reqInfo{}
}

func (g *Gateway) keyEvent(r *http.Request, ev string) {
	info(r).outcome = ev
	g.metrics.Idempotency.WithLabelValues(ev).Inc()
}

// statusWriter remembers the status; Unwrap lets http.ResponseController
// (the reverse proxy's flushes and websocket hijacks) reach the
// connection.
type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// ServeHTTP serves the gateway's own paths, runs guarded routes through
// the duplicate protection and proxies everything else.
func (g *Gateway) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	in := &reqInfo{}
	r = r.WithContext(context.WithValue(r.Context(), infoKey{}, in))
	sw := &statusWriter{ResponseWriter: w}
	g.dispatch(sw, r, in)
	status := sw.status
	if status == 0 {
		status = http.StatusOK
	}
	if in.outcome == "" {
		in.outcome = "answered"
	}
	g.metrics.Requests.WithLabelValues(in.route, in.outcome, strconv.Itoa(status)).Inc()
	g.metrics.Duration.WithLabelValues(in.route).Observe(time.Since(start).Seconds())
	level := slog.LevelDebug
	if in.route != "other" && in.route != "gateway" {
		level = slog.LevelInfo
	}
	if status >= 500 {
		level = slog.LevelWarn
	}
	g.log.Log(r.Context(), level, "request", "method", r.Method, "route", in.route, "status", status,
		"outcome", in.outcome, "duration_ms", float64(time.Since(start).Microseconds())/1000)
}

func (g *Gateway) dispatch(w http.ResponseWriter, r *http.Request, in *reqInfo) {
	p := r.URL.Path
	if ownPath(p) {
		in.route = "gateway"
		g.own(w, r)
		return
	}
	for i := range g.cfg.Routes {
		rt := &g.cfg.Routes[i]
		if rt.Match(r.Method, p) || rt.Match(r.Method, r.URL.EscapedPath()) {
			in.route = rt.String()
			g.guarded[i].ServeHTTP(w, r)
			return
		}
	}
	// A path that names a guarded route in another spelling (//withdraw,
	// /a/../withdraw, /withdraw/), or a method that does in another case
	// (post: Django, Flask, Symfony upper-case it), would reach the same
	// upstream code unguarded: refused.
	if m := strings.ToUpper(r.Method); m != r.Method {
		for i := range g.cfg.Routes {
			rt := &g.cfg.Routes[i]
			if rt.Match(m, p) || rt.Match(m, r.URL.EscapedPath()) || rt.Match(m, strings.TrimSuffix(path.Clean(p), "/")) {
				in.route, in.outcome = rt.String(), "invalid_method"
				idempotency.WriteProblem(w, &idempotency.Problem{Status: http.StatusBadRequest, Code: "invalid_request", Title: "Invalid request",
					Detail: "the method names a guarded route in another case; send " + rt.Method})
				return
			}
		}
	}
	if clean := strings.TrimSuffix(path.Clean(p), "/"); clean != p && clean != "" {
		for i := range g.cfg.Routes {
			if g.cfg.Routes[i].Match(r.Method, clean) {
				in.route, in.outcome = g.cfg.Routes[i].String(), "invalid_path"
				idempotency.WriteProblem(w, &idempotency.Problem{Status: http.StatusBadRequest, Code: "invalid_request", Title: "Invalid request",
					Detail: "the path names a guarded route in a non-canonical form; send " + clean})
				return
			}
		}
	}
	in.route = "other"
	g.proxy.ServeHTTP(w, r)
}

//go:embed snippet.js
var snippet []byte

// own serves the gateway's own paths.
func (g *Gateway) own(w http.ResponseWriter, r *http.Request) {
	type endpoint struct {
		method string
		h      http.HandlerFunc
	}
	var e endpoint
	switch r.URL.Path {
	case "/healthz":
		e = endpoint{"GET", func(w http.ResponseWriter, r *http.Request) {
			writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
		}}
	case "/readyz":
		e = endpoint{"GET", g.readyz}
	case "/metrics":
		e = endpoint{"GET", g.metrics.Handler().ServeHTTP}
	case "/onceguard/v1/submit-tokens":
		e = endpoint{"POST", g.submitToken}
	case "/onceguard/v1/snippet.js":
		e = endpoint{"GET", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "text/javascript; charset=utf-8")
			w.Header().Set("Cache-Control", "public, max-age=300")
			w.Header().Set("X-Content-Type-Options", "nosniff")
			_, _ = w.Write(snippet)
		}}
	default:
		idempotency.WriteProblem(w, &idempotency.Problem{Status: http.StatusNotFound, Code: "not_found", Title: "Not found",
			Detail: "no such gateway path"})
		return
	}
	if r.Method != e.method && !(e.method == "GET" && r.Method == "HEAD") {
		w.Header().Set("Allow", e.method)
		idempotency.WriteProblem(w, &idempotency.Problem{Status: http.StatusMethodNotAllowed, Code: "method_not_allowed", Title: "Method not allowed",
			Detail: "use " + e.method})
		return
	}
	e.h(w, r)
}

// submitToken is POST /onceguard/v1/submit-tokens {"purpose"}: 201
// {"token","purpose","expires_at"} for the request's principal, as
// POST /api/v1/submit-tokens in docs/api.md; the purposes are the routes'.
func (g *Gateway) submitToken(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Cache-Control", "no-store")
	principal, err := g.principal(r)
	if err != nil {
		idempotency.WriteProblem(w, err.(*idempotency.Problem))
		return
	}
	body, p := httpapi.ReadBody(r)
	var req struct {
		Purpose *string `json:"purpose"`
	}
	if p == nil {
		p = httpapi.Decode(body, &req)
	}
	if p == nil && req.Purpose == nil {
		p = httpapi.Missing("purpose")
	}
	if p == nil && !g.purposes[*req.Purpose] {
		names := make([]string, 0, len(g.purposes))
		for n := range g.purposes {
			names = append(names, n)
		}
		slices.Sort(names)
		p = &idempotency.Problem{Status: http.StatusBadRequest, Code: "invalid_purpose", Title: "Invalid purpose",
			Detail: "want one of the guarded routes' purposes: " + strings.Join(names, ", ")}
	}
	if p != nil {
		idempotency.WriteProblem(w, p)
		return
	}
	is, err := g.tokens.Issue(r.Context(), principal, *req.Purpose)
	if err != nil {
		g.log.Warn("submit token not issued", "err", err)
		idempotency.WriteProblem(w, &idempotency.Problem{Status: http.StatusServiceUnavailable, Code: "store_unavailable", Title: "Service unavailable",
			Detail: "the submit token could not be stored; retry later", RetryAfter: 2})
		return
	}
	g.metrics.Tokens.Inc()
	writeJSON(w, http.StatusCreated, map[string]string{"token": is.Token, "purpose": is.Purpose, "expires_at": is.ExpiresAt.UTC().Format(time.RFC3339)})
}
