package httpapi

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"mime"
	"net/http"
	"net/url"
	"regexp"
	"runtime"
	"runtime/debug"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/onceguard/onceguard/idempotency"
	"github.com/onceguard/onceguard/idempotency/idemstore"
	"github.com/onceguard/onceguard/internal/auth"
	"github.com/onceguard/onceguard/internal/money"
	"github.com/onceguard/onceguard/internal/obs"
	"github.com/onceguard/onceguard/internal/psp"
	"github.com/onceguard/onceguard/internal/sqldb"
	"github.com/onceguard/onceguard/internal/sqlstore"
	"github.com/onceguard/onceguard/lock"
	"github.com/onceguard/onceguard/lock/memlock"
	"github.com/onceguard/onceguard/token"
)

// Config wires the service's parts.
type Config struct {
	Store        *sqlstore.Store
	Keys         idemstore.FullStore // Idempotency-Key records, submit tokens, repeat window
	Completer    Completer           // completes a key's record inside a settlement's transaction (nil: Middleware stores answers)
	Provider     psp.Provider
	Currency     string
	MaxAmount    money.Amount
	RequireToken map[string]bool // purposes whose routes take only submit tokens
	Window       time.Duration   // repeat-submit window (0: off)
	KeyTTL       time.Duration
	KeyLease     time.Duration // how long an in-flight key is protected (0: the middleware's 30s)
	// RequestTimeout is a keyed request's deadline: its context ends then,
	// and a settlement after the provider's answer gets a quarter of it
	// more, so that the request ends inside its key's lease and a retry
	// never runs it a second time while it is still going (PITFALLS 17).
	// 0, or more than that allows: 3/5 of the lease (18s of 30s).
	RequestTimeout time.Duration
	TokenTTL       time.Duration
	SessionTTL     time.Duration
	Ping           func(context.Context) error // database liveness, for /readyz
	Locks          *lock.Locker                // per-user and per-order locks (nil: in process); renewed automatically
	LockBackend    func() string               // names the lock backend serving now, for log lines (nil: not named)
	LockTTL        time.Duration               // their TTL: how long a crashed holder blocks the account or order (0: 10s)
	Windows        idemstore.WindowStore       // the repeat-submit window (nil: Keys)
	Components     []Component                 // more /readyz components (Redis, the provider)
	Metrics        *obs.Metrics                // served at /metrics and updated (nil: none)
	Logger         *slog.Logger                // request and audit lines (nil: none)

	// RateLimit is the requests a second one client address may send
	// (RateBurst at once); over it, 429 rate_limited. 0: no limit.
	RateLimit float64
	RateBurst int
	// LoginAttempts is how many failed sign-ins one username may have from
	// one address in 15 minutes before it gets 429 too_many_attempts until
	// the window ends; an address gets 4 times as many over all usernames,
	// a username 10 times as many over all addresses, except from an
	// address with no failure of its own or a pair that signed in before
	// (so that no one can lock an owner out). 0: 5; negative: off.
	LoginAttempts int
	// SignupLimit is how many sign-ups one client address may make in an
	// hour before it gets 429 too_many_signups until the hour ends. Every
	// sign-up that reaches the password hash counts, a taken username
	// too; malformed ones cost nothing and do not. 0: 100; negative: off.
	SignupLimit int
	// ClientIPHeader names a header a trusted proxy in front sets to the
	// client's address (its last value counts), for the limits. Default:
	// the connection's remote address.
	ClientIPHeader string
	// SecureCookies marks the session cookie Secure on every sign-in.
	// Without it the cookie is Secure when the request came over TLS, or
	// through a proxy that says so (X-Forwarded-Proto or Forwarded:
	// proto=https): set it when the service is reached only over TLS
	// through a proxy that sends neither.
	SecureCookies bool
	Web           http.Handler // serves / and /static/... (nil: 404)
}

// Completer completes an Idempotency-Key record inside the caller's
// transaction (idempotency/sqlstore.Store, on the service's database).
type Completer interface {
	CompleteTx(ctx context.Context, tx *sql.Tx, id, lease string, resp idemstore.Response) error
	// CompleteStmt is CompleteTx's statement, for a settlement that runs
	// it in a statement of its own (see sqlstore.Also).
	CompleteStmt(ctx context.Context, id, lease string, resp idemstore.Response) (query string, args []any, err error)
}

// A Component is one part /readyz reports besides the database. Check
// returns its status ("ok", "not configured", the lock backend serving,
// or what is wrong) and whether that is healthy; an unhealthy one makes
// the service degraded, still ready: the database is the only part it
// cannot serve without.
type Component struct {
	Name  string
	Check func(context.Context) (status string, healthy bool)
}

// SessionCookie is the name of the session cookie.
const SessionCookie = "onceguard_session"

type server struct {
	cfg Config
	log *slog.Logger

	rates                           *rates
	loginPair, loginAddr, loginUser *failures
	loginKnown                      *failures // (username, address) pairs that signed in, 30 days
	signups                         *failures // per client address, an hour
	tokens                          *token.Tokens
	locks                           *lock.Locker                       // per-user and per-order locks
	routes                          map[string]map[string]http.Handler // path -> method -> handler
	hashSlots                       chan struct{}                      // password hashes running (see hashing)
}

// New returns the service's HTTP handler (docs/api.md). This slice
// serves health, users, sessions, the account, submit tokens, deposits,
// withdrawals, the ledger, orders and their payment; other paths answer
// 404 not_found.
func New(cfg Config) http.Handler {
	if cfg.Locks == nil {
		cfg.Locks = lock.New(&memlock.Backend{}, &lock.Options{AutoRenew: true})
	}
	if cfg.LockTTL <= 0 {
		cfg.LockTTL = 10 * time.Second
	}
	if cfg.Windows == nil {
		cfg.Windows = cfg.Keys
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.LoginAttempts == 0 {
		cfg.LoginAttempts = 5
	}
	if cfg.SignupLimit == 0 {
		cfg.SignupLimit = 100
	}
	lease := cfg.KeyLease
	if lease <= 0 {
		lease = idempotency.DefaultLease
	}
	if rt := cfg.RequestTimeout; rt <= 0 || rt+rt/4 >= lease {
		cfg.RequestTimeout = lease * 3 / 5
	}
	s := &server{cfg: cfg, log: cfg.Logger, rates: newRates(cfg.RateLimit, cfg.RateBurst), tokens: token.New(cfg.Keys, &token.Options{TTL: cfg.TokenTTL}), locks: cfg.Locks, routes: map[string]map[string]http.Handler{},
		hashSlots: make(chan struct{}, max(2, runtime.GOMAXPROCS(0)))}
	if n := cfg.LoginAttempts; n > 0 {
		s.loginPair = newFailures(n, 15*time.Minute)
		s.loginAddr = newFailures(4*n, 15*time.Minute)
		s.loginUser = newFailures(10*n, 15*time.Minute)
		s.loginKnown = newFailures(1, 30*24*time.Hour)
	}
	if n := cfg.SignupLimit; n > 0 {
		s.signups = newFailures(n, time.Hour)
	}
	s.handle("GET", "/healthz", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { writeJSON(w, 200, map[string]string{"status": "ok"}) }))
	s.handle("GET", "/readyz", http.HandlerFunc(s.readyz))
	if cfg.Metrics != nil {
		s.handle("GET", "/metrics", cfg.Metrics.Handler())
	}
	s.handle("POST", "/api/v1/users", http.HandlerFunc(s.createUser))
	s.handle("POST", "/api/v1/sessions", http.HandlerFunc(s.createSession))
	s.handle("DELETE", "/api/v1/sessions/current", s.authed(s.deleteSession))
	s.handle("GET", "/api/v1/account", s.authed(s.account))
	s.handle("GET", "/api/v1/ledger", s.authed(s.ledger))
	s.handle("POST", "/api/v1/submit-tokens", s.authed(s.createSubmitToken))
	s.handle("POST", "/api/v1/deposits", s.keyed("deposit", s.amountFingerprint("deposit"), http.HandlerFunc(s.deposit)))
	s.handle("POST", "/api/v1/withdrawals", s.keyed("withdrawal", s.amountFingerprint("withdrawal"), http.HandlerFunc(s.withdraw)))
	s.handle("GET", "/api/v1/deposits", s.authed(s.listMovements("deposits")))
	s.handle("GET", "/api/v1/deposits/{id}", s.authed(s.getMovement("deposits")))
	s.handle("GET", "/api/v1/withdrawals", s.authed(s.listMovements("withdrawals")))
	s.handle("GET", "/api/v1/withdrawals/{id}", s.authed(s.getMovement("withdrawals")))
	s.handle("POST", "/api/v1/orders", s.keyed("order", s.orderFingerprint, http.HandlerFunc(s.createOrder)))
	s.handle("GET", "/api/v1/orders", s.authed(s.listOrders))
	s.handle("GET", "/api/v1/orders/{id}", s.authed(s.getOrder))
	s.handle("POST", "/api/v1/orders/{id}/payment", s.keyed("payment", s.paymentFingerprint, http.HandlerFunc(s.pay)))
	return s
}

func (s *server) handle(method, path string, h http.Handler) {
	if s.routes[path] == nil {
		s.routes[path] = map[string]http.Handler{}
	}
	s.routes[path][method] = h
}

// ServeHTTP routes by exact path, answering unknown paths 404 and wrong
// methods 405, both as problems.
func (s *server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	id := obs.RequestID(r)
	w.Header().Set("X-Request-Id", id)
	info := &requestInfo{keyHash: obs.Hash(r.Header.Get("Idempotency-Key"))}
	log := s.log.With("request_id", id)
	r = r.WithContext(context.WithValue(obs.WithLogger(r.Context(), log), requestInfoKey{}, info))
	sw := &statusWriter{ResponseWriter: w}
	route, abort := s.serve(sw, r)
	status := sw.status
	if status == 0 {
		status = http.StatusOK
	}
	method := r.Method
	switch method {
	case "GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS":
	default:
		method = "other"
	}
	if m := s.cfg.Metrics; m != nil {
		m.HTTPRequests.WithLabelValues(route, method, strconv.Itoa(status)).Inc()
		m.HTTPDuration.WithLabelValues(route, method).Observe(obs.Since(start))
		// A submit token is consumed only if its request's answer was kept;
		// one freed for a retry (a 5xx, Call.Forget) is released, and
		// counted consumed when a retry keeps an answer.
		switch {
		case info.tokenUsed && info.released:
			m.Tokens.WithLabelValues("released").Inc()
		case info.tokenUsed:
			m.Tokens.WithLabelValues("consumed").Inc()
		}
	}
	attrs := []any{"method", method, "route", route, "status", status, "duration_ms", float64(time.Since(start).Microseconds()) / 1000}
	if info.userID != "" {
		attrs = append(attrs, "user_id", info.userID)
	}
	if info.keyHash != "" {
		attrs = append(attrs, "key_hash", info.keyHash)
	}
	if info.outcome != "" {
		attrs = append(attrs, "idempotency", info.outcome)
	}
	level := slog.LevelInfo
	if status >= 500 {
		level = slog.LevelWarn
	}
	log.Log(r.Context(), level, "request", attrs...)
	if abort {
		panic(http.ErrAbortHandler) // see serve
	}
}

// serve routes r, and turns a handler's panic (a bug) into the contract's
// 500 internal answer, logged with its stack and counted like any other
// answer, instead of a dropped connection. The Idempotency-Key middleware
// has freed the key on its way up (it re-panics after releasing), so a
// retry runs again under the business tables' unique constraints. If the
// handler had already sent its status, a 500 can no longer be sent and
// the rest of the answer is missing: abort says so, and ServeHTTP then
// aborts the response (http.ErrAbortHandler), so that the client sees a
// broken answer, not a short one that looks whole. http.ErrAbortHandler
// from a handler is passed on as it is.
func (s *server) serve(w *statusWriter, r *http.Request) (route string, abort bool) {
	defer func() {
		v := recover()
		if v == nil {
			return
		}
		if v == http.ErrAbortHandler {
			panic(v)
		}
		route = info(r).route
		obs.Logger(r.Context(), s.log).Error("handler panicked", "panic", fmt.Sprint(v), "stack", string(debug.Stack()))
		if w.status == 0 {
			writeProblem(w, internalProblem())
			return
		}
		w.status, abort = http.StatusInternalServerError, true // for the log line and the metric
	}()
	return s.route(w, r), false
}

// requestInfo is what a request's handlers learn for its log line.
type requestInfo struct {
	userID, keyHash, outcome string
	route                    string // the route pattern (the metric label)
	tokenUsed                bool   // a submit token passed the key check: its request ran
	released                 bool   // the key (and its token) were freed for a retry
}

type requestInfoKey struct{}

func info(r *http.Request) *requestInfo {
	if i, ok := r.Context().Value(requestInfoKey{}).(*requestInfo); ok {
		return i
	}
	return &requestInfo{}
}

// statusWriter remembers the status a handler wrote.
type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
		if code == http.StatusUnauthorized { // RFC 9110 section 11.6.1: a 401 names its scheme
			w.Header().Set("WWW-Authenticate", `Bearer realm="onceguard"`)
		}
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

// route routes by exact path, answering unknown paths 404 and wrong
// methods 405, both as problems, and returns the route's pattern (a
// metric label: "web" for the page, "unmatched" for 404s).
func (s *server) route(w http.ResponseWriter, r *http.Request) string {
	if strings.HasPrefix(r.URL.Path, "/api/") {
		h := w.Header()
		h.Set("Cache-Control", "no-store")
		// JSON answers carry users' own text (an order's description):
		// never let a browser sniff one into HTML.
		h.Set("X-Content-Type-Options", "nosniff")
	}
	pattern := r.URL.Path
	methods, ok := s.routes[pattern]
	if !ok {
		methods, pattern, ok = s.match(r)
	}
	web := !ok && s.cfg.Web != nil && (r.URL.Path == "/" || strings.HasPrefix(r.URL.Path, "/static/"))
	label := pattern
	switch {
	case web:
		label = "web"
	case !ok:
		label = "unmatched"
	}
	info(r).route = label
	if s.rates != nil && label != "/healthz" && label != "/readyz" && label != "/metrics" {
		if wait := s.rates.take(s.clientAddr(r), time.Now()); wait > 0 {
			tooMany(w, "rate_limited", "Too many requests", "this address sends more requests than the service takes; slow down", wait)
			return label
		}
	}
	if web {
		s.cfg.Web.ServeHTTP(w, r)
		return label
	}
	if !ok {
		problem(w, http.StatusNotFound, "not_found", "Not found", "no such resource")
		return label
	}
	h, ok := methods[r.Method]
	if !ok && r.Method == http.MethodHead { // RFC 9110 section 9.3.2: GET's answer without its body
		h, ok = methods[http.MethodGet]
	}
	if ok && !csrfSafe(r) {
		problem(w, http.StatusForbidden, "csrf_rejected", "Cross-site request refused",
			"a sign-up, a sign-in, or a request authenticated by the session cookie, must come from this origin (the latter sending application/json); or use Authorization: Bearer")
		return pattern
	}
	if ok && !sendsJSON(r) {
		problem(w, http.StatusUnsupportedMediaType, "unsupported_media_type", "Unsupported media type",
			"a request body must be sent as Content-Type: application/json")
		return pattern
	}
	if !ok {
		allow := make([]string, 0, len(methods)+1)
		for m := range methods {
			allow = append(allow, m)
			if m == http.MethodGet {
				allow = append(allow, http.MethodHead)
			}
		}
		sort.Strings(allow)
		w.Header().Set("Allow", strings.Join(allow, ", "))
		problem(w, http.StatusMethodNotAllowed, "method_not_allowed", "Method not allowed", r.Method+" is not allowed here")
		return pattern
	}
	h.ServeHTTP(w, r)
	return pattern
}

// csrfSafe tells whether a request may act on its session cookie. A
// state-changing request that carries the cookie and no Authorization
// header must be same-origin (Sec-Fetch-Site, and Origin's scheme and
// host, when the browser sends them) and JSON: a cross-site HTML form
// cannot send application/json, and a cross-site fetch that does needs a
// CORS preflight, which this service never grants. SameSite=Strict already
// keeps the cookie off cross-site requests; this is the second wall (for
// same-site subdomains and old browsers). Bearer requests carry no ambient
// credential and pass.
//
// Signing in sets the cookie, so a sign-in a browser sends from another
// site is refused too, cookie or not (login CSRF: a cross-site form would
// sign the victim's browser in as the attacker, whose account would then
// receive what the victim deposits); so is a sign-up, which a foreign
// page could otherwise send from its visitors' addresses. Browsers name such a request's site
// (Sec-Fetch-Site) or origin (Origin, sent on every cross-origin POST);
// other clients send neither and pass.
func csrfSafe(r *http.Request) bool {
	switch r.Method {
	case http.MethodGet, http.MethodHead, http.MethodOptions:
		return true
	}
	if r.URL.Path == "/api/v1/sessions" || r.URL.Path == "/api/v1/users" {
		return sameOrigin(r)
	}
	if _, ok := bearer(r); ok {
		return true // the credential sessionToken uses; any other scheme falls back to the cookie
	}
	if _, err := r.Cookie(SessionCookie); err != nil {
		return true
	}
	ct := r.Header.Get("Content-Type")
	return sameOrigin(r) && (r.ContentLength == 0 && r.Method == http.MethodDelete || strings.HasPrefix(ct, "application/json"))
}

// sendsJSON tells whether a request that can carry a body sends it as
// application/json (parameters such as charset allowed); one with no body
// passes and meets the decoder's invalid_json instead.
func sendsJSON(r *http.Request) bool {
	switch r.Method {
	case http.MethodPost, http.MethodPut, http.MethodPatch:
	default:
		return true
	}
	ct := r.Header.Get("Content-Type")
	if ct == "" && r.ContentLength == 0 {
		return true
	}
	mt, _, err := mime.ParseMediaType(ct)
	return err == nil && mt == "application/json"
}

// sameOrigin tells whether a browser's request comes from this origin, as
// far as it says (Sec-Fetch-Site, and Origin's scheme and host).
func sameOrigin(r *http.Request) bool {
	switch r.Header.Get("Sec-Fetch-Site") {
	case "", "same-origin", "none":
	default:
		return false
	}
	if o := r.Header.Get("Origin"); o != "" {
		u, err := url.Parse(o)
		if err != nil || u.Host != r.Host {
			return false
		}
		if scheme, known := requestScheme(r); known && !strings.EqualFold(u.Scheme, scheme) {
			return false
		}
	}
	return true
}

// bearer returns the token of an Authorization: Bearer header (the scheme
// in any case, RFC 9110 section 11.1).
func bearer(r *http.Request) (string, bool) {
	scheme, tok, ok := strings.Cut(r.Header.Get("Authorization"), " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return "", false
	}
	return tok, true
}

// requestScheme is the scheme the client used, when it is known: https
// on a TLS connection, else what a TLS-terminating proxy in front says, in
// X-Forwarded-Proto (its first value) or in RFC 7239's Forwarded (the
// first element's proto). A proxy that says neither leaves it unknown,
// and then only the Origin's host is compared: refusing every browser
// behind such a proxy would be worse than the scheme check is worth. The
// headers are trusted for this comparison and the cookie's Secure flag
// only: a cross-site page cannot set them without a CORS preflight, which
// this service never grants.
func requestScheme(r *http.Request) (scheme string, known bool) {
	if r.TLS != nil {
		return "https", true
	}
	p, _, _ := strings.Cut(r.Header.Get("X-Forwarded-Proto"), ",")
	if p = strings.ToLower(strings.TrimSpace(p)); p == "https" || p == "http" {
		return p, true
	}
	first, _, _ := strings.Cut(r.Header.Get("Forwarded"), ",")
	for _, pair := range strings.Split(first, ";") {
		k, v, _ := strings.Cut(strings.TrimSpace(pair), "=")
		if strings.EqualFold(k, "proto") {
			if v = strings.ToLower(strings.Trim(v, `"`)); v == "https" || v == "http" {
				return v, true
			}
		}
	}
	return "", false
}

// secure tells whether the client came over https, so that the session
// cookie is marked Secure (also behind a TLS-terminating proxy).
func secure(r *http.Request) bool {
	scheme, _ := requestScheme(r)
	return scheme == "https"
}

// match resolves the paths with an id: /api/v1/{orders,deposits,
// withdrawals}/{id} and /api/v1/orders/{id}/payment.
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

func problem(w http.ResponseWriter, status int, code, title, detail string) {
	idempotency.WriteProblem(w, &idempotency.Problem{Status: status, Code: code, Title: title, Detail: detail})
}

func writeProblem(w http.ResponseWriter, p *idempotency.Problem) { idempotency.WriteProblem(w, p) }

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(jsonBody(v))
}

// jsonBody is v as the service sends it: JSON and a newline.
func jsonBody(v any) []byte {
	b, _ := json.Marshal(v)
	return append(b, '\n')
}

func (s *server) internal(w http.ResponseWriter, r *http.Request, err error) {
	p := s.storeProblem(err)
	if p.Code == codeInterrupted {
		// Nobody failed: the client went away before the answer. Not
		// an error line, nor a 500 on the dashboards.
		obs.Logger(r.Context(), s.log).Info("request ended before it was answered", "status", p.Status, "error", err.Error())
	} else {
		obs.Logger(r.Context(), s.log).Error("request failed", "status", p.Status, "error", err.Error())
	}
	writeProblem(w, p)
}

// codeInterrupted is the code of a request that ended before its answer,
// the same as the idempotency middleware's.
const codeInterrupted = "request_interrupted"

// storeProblem is the answer to a store error: 503 request_interrupted
// when the call's context was cancelled (the client went away; a keyed
// request's key is freed, as after any 5xx), 503 store_unavailable with
// Retry-After when the database could not answer (down, out of
// connections, or the request's deadline passed), else 500.
func (s *server) storeProblem(err error) *idempotency.Problem {
	if errors.Is(err, context.Canceled) {
		return &idempotency.Problem{Status: http.StatusServiceUnavailable, Code: codeInterrupted, Title: "Request interrupted",
			Detail: "the request ended (the client went away) before it was answered; retry it", RetryAfter: 1}
	}
	if isUnavailable(err) {
		return &idempotency.Problem{Status: http.StatusServiceUnavailable, Code: "store_unavailable", Title: "Service unavailable",
			Detail: "the database is unreachable; retry later", RetryAfter: 2}
	}
	return internalProblem()
}

// internalProblem is the contract's 500 internal.
func internalProblem() *idempotency.Problem {
	return &idempotency.Problem{Status: http.StatusInternalServerError, Code: "internal", Title: "Internal error", Detail: "something went wrong on our side"}
}

// busy answers 503 busy: the resource's lock could not be had in time,
// or was lost before the write (a stale fence). Nothing changed, and as a
// 5xx it frees the Idempotency-Key: a retry runs again, safely.
func (s *server) busy(w http.ResponseWriter) {
	w.Header().Set("Retry-After", "1")
	problem(w, http.StatusServiceUnavailable, "busy", "Busy", "the account or order is busy; nothing changed, retry shortly")
}

func isUnavailable(err error) bool {
	return errors.Is(err, idempotency.ErrUnavailable) || sqldb.Unavailable(err)
}

// readyz reports each component: 503 unavailable without the database,
// 200 degraded when another component is not ok (Redis unreachable and
// locks on the database, the provider unreachable and settlements left to
// the reconciler), else 200 ok.
//
// The checks run at once, each with its own deadline, so that one that
// hangs (a black-holed database) costs the others nothing and is the only
// one reported.
func (s *server) readyz(w http.ResponseWriter, r *http.Request) {
	type result struct {
		name, status string
		healthy      bool
	}
	checks := make([]Component, 0, len(s.cfg.Components)+1)
	if ping := s.cfg.Ping; ping != nil {
		checks = append(checks, Component{Name: "database", Check: func(ctx context.Context) (string, bool) {
			if err := ping(ctx); err != nil {
				return "unreachable", false
			}
			return "ok", true
		}})
	}
	checks = append(checks, s.cfg.Components...)
	results := make(chan result, len(checks))
	for _, c := range checks {
		go func() {
			ctx, cancel := context.WithTimeout(r.Context(), readyTimeout)
			defer cancel()
			st, healthy := c.Check(ctx)
			results <- result{c.Name, st, healthy}
		}()
	}
	comps := map[string]string{"database": "ok"}
	status, code := "ok", http.StatusOK
	degraded := false
	for range checks {
		res := <-results
		comps[res.name] = res.status
		switch {
		case res.name == "database" && !res.healthy:
			status, code = "unavailable", http.StatusServiceUnavailable
		case !res.healthy:
			degraded = true
		}
	}
	if degraded && status == "ok" {
		status = "degraded"
	}
	writeJSON(w, code, map[string]any{"status": status, "components": comps})
}

// readyTimeout bounds each /readyz check.
const readyTimeout = 2 * time.Second

func newID(prefix string) string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return prefix + hex.EncodeToString(b[:])
}

func ts(us int64) string { return time.UnixMicro(us).UTC().Format(time.RFC3339) }

// --- authentication ---

type userKey struct{}

// sessionToken returns the bearer token or the session cookie.
func sessionToken(r *http.Request) string {
	if tok, ok := bearer(r); ok {
		return tok
	}
	if c, err := r.Cookie(SessionCookie); err == nil {
		return c.Value
	}
	return ""
}

func (s *server) user(r *http.Request) (sqlstore.User, error) {
	tok := sessionToken(r)
	if tok == "" {
		return sqlstore.User{}, sqlstore.ErrNotFound
	}
	u, err := s.cfg.Store.SessionUser(r.Context(), auth.HashToken(tok), time.Now().UnixMicro())
	if err == nil {
		info(r).userID = u.ID
	}
	return u, err
}

func (s *server) authed(next func(http.ResponseWriter, *http.Request, sqlstore.User)) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u, err := s.user(r)
		if errors.Is(err, sqlstore.ErrNotFound) {
			problem(w, http.StatusUnauthorized, "unauthenticated", "Authentication required", "sign in first")
			return
		} else if err != nil {
			s.internal(w, r, err)
			return
		}
		next(w, r, u)
	})
}

var (
	usernameRE = regexp.MustCompile(`^[a-z0-9_]{3,32}$`)
	idRE       = regexp.MustCompile(`^[a-z0-9_-]{1,64}$`) // ours are lowercase: another spelling names nothing, on every database
)

type credentials struct {
	Username *string `json:"username"`
	Password *string `json:"password"`
}

func (s *server) readCredentials(w http.ResponseWriter, r *http.Request) (string, string, bool) {
	body, p := ReadBody(r)
	if p == nil {
		var c credentials
		if p = Decode(body, &c); p == nil {
			switch {
			case c.Username == nil:
				p = Missing("username")
			case c.Password == nil:
				p = Missing("password")
			default:
				return *c.Username, *c.Password, true
			}
		}
	}
	writeProblem(w, p)
	return "", "", false
}

func (s *server) createUser(w http.ResponseWriter, r *http.Request) {
	name, pass, ok := s.readCredentials(w, r)
	if !ok {
		return
	}
	if !usernameRE.MatchString(name) {
		problem(w, http.StatusBadRequest, "invalid_username", "Invalid username", "3 to 32 of a-z, 0-9 and _")
		return
	}
	if len(pass) < 8 || len(pass) > 128 {
		problem(w, http.StatusBadRequest, "invalid_password", "Invalid password", "8 to 128 bytes")
		return
	}
	// Account spam: counted before the (slow) hash, like a sign-in, and
	// given back only when the attempt never got to create a user.
	signup := attempt{s.signups, s.clientAddr(r)}
	if wait := reserveAll(time.Now(), signup); wait > 0 {
		obs.Logger(r.Context(), s.log).Warn("sign-up refused: too many sign-ups", "client", signup.key)
		tooMany(w, "too_many_signups", "Too many sign-ups", "too many accounts created from this address; wait before creating another", wait)
		return
	}
	var hash string
	if !s.hashing(w, r, func() { hash = auth.HashPassword(pass) }) {
		undoAll(signup)
		return
	}
	// The hash is spent: the user is created even if the client has hung
	// up meanwhile, so that hanging up during the hash never gets the
	// attempt back (nor logs a failure that was only the client leaving).
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), s.cfg.RequestTimeout)
	defer cancel()
	id := newID("u_")
	err := s.cfg.Store.CreateUser(ctx, id, name, hash, s.cfg.Currency, time.Now().UnixMicro())
	if errors.Is(err, sqlstore.ErrUsernameTaken) {
		problem(w, http.StatusConflict, "username_taken", "Username taken", "choose another username")
		return
	} else if err != nil {
		undoAll(signup) // the store's failure, not the caller's doing
		s.internal(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, map[string]string{"id": id, "username": name})
}

func (s *server) createSession(w http.ResponseWriter, r *http.Request) {
	name, pass, ok := s.readCredentials(w, r)
	if !ok {
		return
	}
	// Brute force: refused before the (slow) hash is even computed. Each
	// attempt is counted as a failure before it is made (and given back
	// when it succeeds), so that attempts sent at once cannot all pass a
	// check that only finished ones counted toward.
	addr, now := s.clientAddr(r), time.Now()
	refused := func(wait time.Duration) {
		obs.Logger(r.Context(), s.log).Warn("sign-in refused: too many failed attempts", "username", logName(name), "client", addr)
		tooMany(w, "too_many_attempts", "Too many sign-in attempts", "too many failed sign-ins; wait before trying again", wait)
	}
	invalid := func() {
		obs.Logger(r.Context(), s.log).Warn("sign-in refused", "username", logName(name), "client", addr)
		problem(w, http.StatusUnauthorized, "invalid_credentials", "Invalid credentials", "wrong username or password")
	}
	if !usernameRE.MatchString(name) {
		// A name no user can have is unknown, on every database (MySQL's
		// collations would match "ALICE", "alice " or "alicé" to alice).
		// It costs no hash, and it counts against the address only: a
		// counter per such name would let anyone fill the limiters with
		// names of up to 64 KiB.
		if wait := reserveAll(now, attempt{s.loginAddr, addr}); wait > 0 {
			refused(wait)
			return
		}
		invalid()
		return
	}
	pair := name + "\x00" + addr
	if wait := s.loginPair.reserve(pair, now); wait > 0 {
		refused(wait)
		return
	}
	wait, n := s.loginAddr.reserveN(addr, now)
	if wait > 0 {
		s.loginPair.undo(pair)
		refused(wait)
		return
	}
	attempts := []attempt{{s.loginPair, pair}, {s.loginAddr, addr}}
	// The per-username limit stops guessers spread over many addresses,
	// but must not let them lock the owner out: an address with no other
	// failure (n counts this attempt, atomically) and a pair that signed in
	// before are counted by it but not refused.
	exempt := n == 1 || s.loginKnown.has(pair, now)
	if wait := s.loginUser.reserve(name, now); wait == 0 {
		attempts = append(attempts, attempt{s.loginUser, name})
	} else if !exempt {
		undoAll(attempts...)
		refused(wait)
		return
	}
	giveBack := func() { undoAll(attempts...) }
	u, err := s.cfg.Store.UserByName(r.Context(), name)
	if err != nil && !errors.Is(err, sqlstore.ErrNotFound) {
		giveBack() // not the caller's failure
		s.internal(w, r, err)
		return
	}
	hash := u.PasswordHash
	if hash == "" {
		hash = dummyHash // spend the same time on unknown users
	}
	var perr error
	if !s.hashing(w, r, func() { perr = auth.CheckPassword(hash, pass) }) {
		giveBack()
		return
	}
	if perr != nil || err != nil {
		invalid() // the reservations stay: they were the failures
		return
	}
	undoAll(attempts[1:]...) // this attempt was no failure
	s.loginPair.forget(pair) // and the pair's earlier ones are forgiven
	s.loginKnown.reserve(pair, now)
	// Always a new token, whatever the request carried: a session an
	// attacker planted (fixation) never becomes authenticated.
	tok, th := auth.NewSessionToken()
	exp := now.Add(s.cfg.SessionTTL)
	if err := s.cfg.Store.CreateSession(r.Context(), th, u.ID, exp.UnixMicro(), now.UnixMicro()); err != nil {
		s.internal(w, r, err)
		return
	}
	http.SetCookie(w, &http.Cookie{Name: SessionCookie, Value: tok, Path: "/", Expires: exp, HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: s.cfg.SecureCookies || secure(r)})
	writeJSON(w, http.StatusCreated, map[string]string{"token": tok, "expires_at": exp.UTC().Format(time.RFC3339)})
}

// tooMany answers 429 with code and Retry-After: a limit refused the
// request for wait.
func tooMany(w http.ResponseWriter, code, title, detail string, wait time.Duration) {
	writeProblem(w, &idempotency.Problem{Status: http.StatusTooManyRequests, Code: code, Title: title, Detail: detail, RetryAfter: retryAfter(wait)})
}

var dummyHash = auth.HashPassword("timing equaliser, never a password")

// hashWait bounds how long a sign-up or sign-in waits for a hashing slot.
const hashWait = 5 * time.Second

// hashing runs f, a password hash, once one of a few slots is free (as
// many as the Go scheduler's processors, at least 2), and reports whether
// it ran. An argon2id hash holds 19 MiB while it runs, and sign-ins and
// sign-ups sent at once, well within the rate limits, would otherwise
// each take that much: a queue costs no memory, and the hashes are
// CPU-bound, so more at once would not finish sooner. A request that
// waits hashWait, or ends, is answered 503 busy (Retry-After: 1).
func (s *server) hashing(w http.ResponseWriter, r *http.Request, f func()) bool {
	select {
	case s.hashSlots <- struct{}{}:
	default:
		t := time.NewTimer(hashWait)
		defer t.Stop()
		select {
		case s.hashSlots <- struct{}{}:
		case <-t.C:
			s.busyHashing(w)
			return false
		case <-r.Context().Done():
			s.busyHashing(w)
			return false
		}
	}
	defer func() { <-s.hashSlots }()
	f()
	return true
}

func (s *server) busyHashing(w http.ResponseWriter) {
	w.Header().Set("Retry-After", "1")
	problem(w, http.StatusServiceUnavailable, "busy", "Busy", "too many sign-ins and sign-ups at once; nothing changed, retry shortly")
}

// logName is a sign-in name as logged: as sent if a user could have it,
// else cut to 64 bytes and marked.
func logName(name string) string {
	if usernameRE.MatchString(name) {
		return name
	}
	if len(name) > 64 {
		name = name[:64] + "…"
	}
	return "(invalid) " + strconv.Quote(name)
}

func (s *server) deleteSession(w http.ResponseWriter, r *http.Request, _ sqlstore.User) {
	if err := s.cfg.Store.DeleteSession(r.Context(), auth.HashToken(sessionToken(r))); err != nil {
		s.internal(w, r, err)
		return
	}
	http.SetCookie(w, &http.Cookie{Name: SessionCookie, Value: "", Path: "/", MaxAge: -1, HttpOnly: true, SameSite: http.SameSiteStrictMode})
	w.WriteHeader(http.StatusNoContent)
}

func (s *server) account(w http.ResponseWriter, r *http.Request, u sqlstore.User) {
	bal, cur, err := s.cfg.Store.Account(r.Context(), u.ID)
	if err != nil {
		s.internal(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"user_id": u.ID, "username": u.Username, "balance": bal, "currency": cur})
}

// ledger answers the whole journal: its amounts must sum to the balance
// (docs/api.md), so it is never cut short like the other lists.
func (s *server) ledger(w http.ResponseWriter, r *http.Request, u sqlstore.User) {
	entries, err := s.cfg.Store.Ledger(r.Context(), u.ID, 0)
	writeList(s, w, r, entries, err, func(e sqlstore.LedgerEntry) map[string]any {
		return map[string]any{"id": fmt.Sprint(e.ID), "kind": e.Kind, "amount": e.Amount, "balance_after": e.BalanceAfter, "ref": e.Ref, "created_at": ts(e.CreatedAt)}
	})
}

var purposes = map[string]bool{"withdrawal": true, "deposit": true, "order": true, "payment": true}

// Purpose reports whether p is a submit token purpose (a key of
// Config.RequireToken): withdrawal, deposit, order or payment.
func Purpose(p string) bool { return purposes[p] }

func (s *server) createSubmitToken(w http.ResponseWriter, r *http.Request, u sqlstore.User) {
	body, p := ReadBody(r)
	var req struct {
		Purpose *string `json:"purpose"`
	}
	if p == nil {
		p = Decode(body, &req)
	}
	if p == nil && req.Purpose == nil {
		p = Missing("purpose")
	}
	if p != nil {
		writeProblem(w, p)
		return
	}
	if !purposes[*req.Purpose] {
		problem(w, http.StatusBadRequest, "invalid_purpose", "Invalid purpose", "one of withdrawal, deposit, order, payment")
		return
	}
	is, err := s.tokens.Issue(r.Context(), u.ID, *req.Purpose)
	if err != nil {
		s.internal(w, r, err)
		return
	}
	if m := s.cfg.Metrics; m != nil {
		m.Tokens.WithLabelValues("issued").Inc()
	}
	writeJSON(w, http.StatusCreated, map[string]string{"token": is.Token, "purpose": is.Purpose, "expires_at": is.ExpiresAt.UTC().Format(time.RFC3339)})
}

// --- money ---

// keyed wraps a money route in the Idempotency-Key middleware, with the
// contract's order of checks; the route's body rules give the fingerprint.
func (s *server) keyed(purpose string, fingerprint func(*http.Request, []byte) (string, error), next http.Handler) http.Handler {
	h := s.keyMiddleware(purpose, fingerprint)(next)
	// The deadline comes first: the key's lease starts inside it.
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), s.cfg.RequestTimeout)
		defer cancel()
		h.ServeHTTP(w, r.WithContext(ctx))
	})
}

func (s *server) keyMiddleware(purpose string, fingerprint func(*http.Request, []byte) (string, error)) func(http.Handler) http.Handler {
	return idempotency.Middleware(idempotency.Config{
		Store: s.cfg.Keys, Tokens: s.tokens, Purpose: purpose, RequireToken: s.cfg.RequireToken[purpose],
		Windows: s.cfg.Windows, Window: s.window(purpose), TTL: s.cfg.KeyTTL, Lease: s.cfg.KeyLease, MaxBody: MaxBody,
		Principal: func(r *http.Request) (string, error) {
			u, err := s.user(r)
			if err != nil && !errors.Is(err, sqlstore.ErrNotFound) {
				return "", s.storeProblem(err)
			}
			return u.ID, err
		},
		Fingerprint: fingerprint,
		OnEvent:     s.keyEvent,
	})
}

// keyEvent counts and logs what the Idempotency-Key check decided.
func (s *server) keyEvent(r *http.Request, ev string) {
	i := info(r)
	switch ev {
	case "new", "recovered":
		// Counted at the request's end (ServeHTTP): consumed, or released
		// when the answer is not kept.
		i.tokenUsed = strings.HasPrefix(r.Header.Get("Idempotency-Key"), token.Prefix)
	case "released":
		i.released = true
	}
	i.outcome = ev
	m := s.cfg.Metrics
	if m == nil {
		return
	}
	m.Idempotency.WithLabelValues(ev).Inc()
	switch ev {
	case "duplicate_submission":
		m.RepeatRejections.WithLabelValues(info(r).route).Inc()
	case "token_invalid":
		m.Tokens.WithLabelValues("invalid").Inc()
	case "token_foreign":
		m.Tokens.WithLabelValues("foreign").Inc()
	}
}

// audit writes the one line per money movement (who, what, amount, key
// hash, outcome) and counts it.
func (s *server) audit(r *http.Request, kind, id string, amount money.Amount, outcome string) {
	if m := s.cfg.Metrics; m != nil {
		m.Money.WithLabelValues(kind, outcome).Inc()
	}
	obs.Logger(r.Context(), s.log).Info("money", "audit", true, "kind", kind, "id", id, "user_id", info(r).userID,
		"amount", amount.String(), "currency", s.cfg.Currency, "key_hash", info(r).keyHash, "outcome", outcome)
}

// amountFingerprint: bodies {"amount"} compare by value: "7", "7.00" and
// 7 are one body.
func (s *server) amountFingerprint(purpose string) func(*http.Request, []byte) (string, error) {
	return func(_ *http.Request, body []byte) (string, error) {
		a, p := s.amount(body)
		if p != nil {
			return "", p
		}
		return purpose + ":" + fmt.Sprint(int64(a)), nil
	}
}

func (s *server) window(purpose string) time.Duration {
	if purpose == "withdrawal" || purpose == "order" {
		return s.cfg.Window
	}
	return 0
}

// amount reads {"amount": ...} under the contract's rules.
func (s *server) amount(body []byte) (money.Amount, *idempotency.Problem) {
	var req struct {
		Amount json.RawMessage `json:"amount"`
	}
	if p := Decode(body, &req); p != nil {
		return 0, p
	}
	return s.parseAmount(req.Amount)
}

func (s *server) parseAmount(raw json.RawMessage) (money.Amount, *idempotency.Problem) {
	if raw == nil {
		return 0, Missing("amount")
	}
	a, err := money.FromJSON(raw)
	if err != nil || a <= 0 || a > s.cfg.MaxAmount {
		return 0, &idempotency.Problem{Status: http.StatusBadRequest, Code: "invalid_amount", Title: "Invalid amount",
			Detail: fmt.Sprintf("a string or number like \"10.00\", more than 0 and at most %s", s.cfg.MaxAmount)}
	}
	return a, nil
}

func movementJSON(m sqlstore.Movement) map[string]any {
	return map[string]any{"id": m.ID, "amount": m.Amount, "status": m.Status, "created_at": ts(m.CreatedAt)}
}

// MaxBalance bounds an account's balance, far below where its int64
// minor units would overflow; MaxAmountLimit bounds --max-amount, so that
// deposits racing past the balance check would have to be thousands.
const (
	MaxBalance     = money.Amount(math.MaxInt64 / 2)
	MaxAmountLimit = money.Amount(1_000_000_000_000_000) // 10 000 000 000 000.00
)

func (s *server) deposit(w http.ResponseWriter, r *http.Request) {
	call, _ := idempotency.FromContext(r.Context())
	body, _ := ReadBody(r)
	a, _ := s.amount(body) // validated by the middleware
	// Refused before the provider is charged: a credit that would
	// overflow the balance could not be settled after it.
	bal, _, err := s.cfg.Store.Account(r.Context(), call.Scope.Principal)
	if err != nil {
		s.internal(w, r, err)
		return
	}
	if bal > MaxBalance-a {
		problem(w, http.StatusUnprocessableEntity, "balance_limit", "Balance limit", "this deposit would take the balance over the most an account can hold; nothing changed")
		return
	}
	m, created, err := s.cfg.Store.CreateDeposit(r.Context(), sqlstore.Movement{ID: newID("dep_"), UserID: call.Scope.Principal, Key: call.Key, Amount: a, CreatedAt: time.Now().UnixMicro()})
	if err != nil {
		s.internal(w, r, err)
		return
	}
	if !created && m.Amount != a {
		keyReused(w)
		return
	}
	s.settleAndAnswer(w, r, psp.Charge, m, call)
}

func (s *server) withdraw(w http.ResponseWriter, r *http.Request) {
	call, _ := idempotency.FromContext(r.Context())
	body, _ := ReadBody(r)
	a, _ := s.amount(body)
	// The user's lock serialises their withdrawals; its fence goes into the
	// transaction, where the account refuses a writer whose lock ran out.
	var (
		m       sqlstore.Movement
		created bool
	)
	err := s.underLock(r.Context(), "user:"+call.Scope.Principal, true, func(fence int64) (err error) {
		m, created, err = s.cfg.Store.Withdraw(r.Context(), sqlstore.Movement{ID: newID("wd_"), UserID: call.Scope.Principal, Key: call.Key, Amount: a, CreatedAt: time.Now().UnixMicro()}, fence)
		return err
	})
	if errors.Is(err, errLock) || errors.Is(err, sqlstore.ErrStaleFence) {
		s.audit(r, "withdrawal", "", a, "busy")
		s.busy(w)
		return
	} else if errors.Is(err, sqlstore.ErrInsufficientFunds) {
		s.audit(r, "withdrawal", "", a, "insufficient_funds")
		problem(w, http.StatusUnprocessableEntity, "insufficient_funds", "Insufficient funds", "the balance does not cover this withdrawal; nothing changed")
		return
	} else if err != nil {
		s.internal(w, r, err)
		return
	}
	if !created && m.Amount != a {
		keyReused(w)
		return
	}
	s.settleAndAnswer(w, r, psp.Payout, m, call)
}

// keyReused answers a request whose (user, key) movement already exists
// and was made by another request: the key was reused after its record
// expired (--key-ttl), or after a 5xx freed it. The business table's UNIQUE (user_id, idempotency_key) refused a second
// movement; the first is not this request's answer. As the middleware
// answers a different body under a known key.
func keyReused(w http.ResponseWriter) {
	problem(w, http.StatusUnprocessableEntity, "idempotency_key_reused", "Idempotency-Key reused", "this key was already used for a different request; use a new key")
}

// errLock wraps a failure to take a resource's lock.
var errLock = errors.New("lock not had")

// underLock runs write holding the lock on key (blocking up to 5 s when
// wait, else one try), with the lease's fence, and releases it. A write
// refused for a stale fence changed nothing: that happens when two
// holders overlapped (a lock that expired under a paused holder, or the
// switch between Redis and the database, where each side grants its own
// lease) and the older one came second. It is retried under a new lease,
// up to three attempts, so the switch does not fail requests. A lock not
// had is errLock, joined with the locker's error.
func (s *server) underLock(ctx context.Context, key string, wait bool, write func(fence int64) error) error {
	for attempt := 1; ; attempt++ {
		var (
			lease *lock.Lease
			err   error
		)
		if wait {
			wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			lease, err = s.locks.Acquire(wctx, key, s.cfg.LockTTL)
			cancel()
		} else {
			lease, err = s.locks.TryAcquire(ctx, key, s.cfg.LockTTL)
		}
		if err != nil {
			if !errors.Is(err, lock.ErrNotAcquired) {
				s.lockLog(ctx).Warn("lock acquire failed", "lock", key, "result", obs.LockResult(err), "error", err.Error())
			}
			return errors.Join(errLock, err)
		}
		held := time.Now()
		err = write(lease.Fence())
		rerr := lease.Release(ctx)
		switch lost := lease.Err(); {
		case lost == nil:
		case errors.Is(lost, lock.ErrNotHeld):
			// The lease ended while held: it expired, renewal found it
			// gone, or the release found it expired or someone else's.
			// The fence refused the write if another holder came in
			// between.
			s.lockLog(ctx).Warn("lock lost", "lock", key, "held_ms", time.Since(held).Milliseconds(), "cause", lost.Error())
		default:
			// The release did not reach the backend (ErrUnavailable: it
			// is down, or did not answer in time) or failed there. That
			// is not a lost lock: nothing ended the lease while it was
			// held; the backend still holds it until its TTL passes, so
			// the next holder may wait that long.
			cause := lost
			if rerr != nil {
				cause = rerr
			}
			s.lockLog(ctx).Warn("lock release failed", "lock", key, "held_ms", time.Since(held).Milliseconds(), "result", obs.LockResult(cause),
				"cause", cause.Error(), "expires_within", s.cfg.LockTTL.String())
		}
		if !errors.Is(err, sqlstore.ErrStaleFence) || attempt == 3 {
			return err
		}
		obs.Logger(ctx, s.log).Info("stale fence: the write was refused and is retried under a new lease", "lock", key, "attempt", attempt)
	}
}

// lockLog is the request's logger for a lock line, naming the backend
// serving now.
func (s *server) lockLog(ctx context.Context) *slog.Logger {
	l := obs.Logger(ctx, s.log)
	if s.cfg.LockBackend != nil {
		l = l.With("backend", s.cfg.LockBackend())
	}
	return l
}

// settleAndAnswer answers a created (or found) movement: a pending one is
// first sent to the provider under its own id and settled as it says.
// With a Completer, the settlement and the key's stored answer commit in
// one transaction (atomic phases): after a crash there is never a settled
// movement whose key would run again, nor a stored answer the books do
// not show. An unknown outcome (a timeout) leaves it pending for the
// reconciler; Middleware then stores the pending answer as usual.
func (s *server) settleAndAnswer(w http.ResponseWriter, r *http.Request, kind psp.Kind, m sqlstore.Movement, call *idempotency.Call) {
	ctx := r.Context()
	if m.Status == "pending" {
		if op, err := s.cfg.Provider.Do(ctx, kind, m.ID, m.Amount); err == nil {
			settled := m
			settled.Status = string(op.Status)
			body := jsonBody(movementJSON(settled))
			resp := call.Response(http.StatusCreated, http.Header{"Content-Type": {"application/json"}}, body)
			// Recorded even when the request's deadline has passed, but
			// within a quarter of it more: still inside the key's lease.
			dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.cfg.RequestTimeout/4)
			defer cancel()
			complete := sqlstore.Also{Tx: func(tx *sql.Tx) error { return s.cfg.Completer.CompleteTx(dctx, tx, call.ID, call.Lease, resp) }}
			settle := s.cfg.Store.SettleWithdrawal
			if kind == psp.Charge {
				settle = s.cfg.Store.SettleDeposit
			}
			ok, now := op.Status == psp.Succeeded, time.Now().UnixMicro()
			err, moved := errors.New("no completer"), false
			if s.cfg.Completer != nil {
				complete.Stmt, complete.Args, err = s.cfg.Completer.CompleteStmt(dctx, call.ID, call.Lease, resp)
				if err == nil {
					moved, err = settle(dctx, m.ID, ok, now, complete)
				}
				if err == nil {
					call.MarkCompleted()
				}
			}
			if err != nil { // the lease was lost, say: settle alone
				moved, err = settle(dctx, m.ID, ok, now)
			}
			if err != nil {
				// Whether the settlement (and the stored answer) committed
				// is unknown: a commit whose acknowledgement was lost. Not
				// a 201 "pending" that a replay may contradict: 503, and
				// the retry gets the recorded answer, or runs again (the
				// movement's unique key and the provider's idempotency by
				// its id keep that to one effect).
				s.internal(w, r, err)
				return
			}
			m = settled
			if !moved {
				// The reconciler settled it meanwhile (the provider's answer
				// for one key is one answer) and wrote its audit line.
				writeJSON(w, http.StatusCreated, movementJSON(m))
				return
			}
		}
	}
	s.audit(r, map[psp.Kind]string{psp.Charge: "deposit", psp.Payout: "withdrawal"}[kind], m.ID, m.Amount, m.Status)
	writeJSON(w, http.StatusCreated, movementJSON(m))
}

// --- orders and payments ---

type orderRequest struct {
	Amount      json.RawMessage `json:"amount"`
	Description *string         `json:"description"`
}

func (s *server) order(body []byte) (money.Amount, string, *idempotency.Problem) {
	var req orderRequest
	if p := Decode(body, &req); p != nil {
		return 0, "", p
	}
	a, p := s.parseAmount(req.Amount)
	if p != nil {
		return 0, "", p
	}
	desc := ""
	if req.Description != nil {
		desc = *req.Description
	}
	if n := len([]rune(desc)); n > 200 {
		return 0, "", &idempotency.Problem{Status: http.StatusBadRequest, Code: "invalid_request", Title: "Invalid request", Detail: "description: at most 200 characters"}
	}
	return a, desc, nil
}

func (s *server) orderFingerprint(_ *http.Request, body []byte) (string, error) {
	a, desc, p := s.order(body)
	if p != nil {
		return "", p
	}
	b, _ := json.Marshal([]any{"order", int64(a), desc})
	return string(b), nil
}

func (s *server) paymentFingerprint(_ *http.Request, body []byte) (string, error) {
	var req struct {
		Method *string `json:"method"`
	}
	if p := Decode(body, &req); p != nil {
		return "", p
	}
	if req.Method == nil {
		return "", Missing("method")
	}
	if *req.Method != "wallet" {
		return "", &idempotency.Problem{Status: http.StatusBadRequest, Code: "invalid_request", Title: "Invalid request", Detail: "method: only \"wallet\""}
	}
	return "payment:wallet", nil
}

func orderJSON(o sqlstore.Order) map[string]any {
	return map[string]any{"id": o.ID, "order_no": o.OrderNo, "amount": o.Amount, "description": o.Description, "status": o.Status, "created_at": ts(o.CreatedAt)}
}

func (s *server) createOrder(w http.ResponseWriter, r *http.Request) {
	call, _ := idempotency.FromContext(r.Context())
	body, _ := ReadBody(r)
	a, desc, _ := s.order(body) // validated by the middleware
	o, created, err := s.cfg.Store.CreateOrder(r.Context(), sqlstore.Order{ID: newID("ord_"), OrderNo: newID("ON"), UserID: call.Scope.Principal,
		Key: call.Key, Description: desc, Amount: a, CreatedAt: time.Now().UnixMicro()})
	if err != nil {
		s.internal(w, r, err)
		return
	}
	if !created && (o.Amount != a || o.Description != desc) {
		keyReused(w)
		return
	}
	writeJSON(w, http.StatusCreated, orderJSON(o))
}

func (s *server) listOrders(w http.ResponseWriter, r *http.Request, u sqlstore.User) {
	orders, err := s.cfg.Store.Orders(r.Context(), u.ID, 1000)
	writeList(s, w, r, orders, err, orderJSON)
}

func (s *server) getOrder(w http.ResponseWriter, r *http.Request, u sqlstore.User) {
	o, err := s.cfg.Store.OrderByID(r.Context(), u.ID, r.PathValue("id"))
	writeOne(s, w, r, o, err, orderJSON)
}

// writeList answers {"items": [...]} (newest first, as the store gives
// them), or the store's error.
func writeList[T any](s *server, w http.ResponseWriter, r *http.Request, items []T, err error, toJSON func(T) map[string]any) {
	if err != nil {
		s.internal(w, r, err)
		return
	}
	out := make([]map[string]any, 0, len(items))
	for _, it := range items {
		out = append(out, toJSON(it))
	}
	writeJSON(w, http.StatusOK, map[string]any{"items": out})
}

// writeOne answers one resource; another user's, like a missing one, is
// 404 not_found.
func writeOne[T any](s *server, w http.ResponseWriter, r *http.Request, item T, err error, toJSON func(T) map[string]any) {
	if errors.Is(err, sqlstore.ErrNotFound) {
		problem(w, http.StatusNotFound, "not_found", "Not found", "no such resource")
		return
	} else if err != nil {
		s.internal(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, toJSON(item))
}

// pay takes the order's lock first, so that a payment racing another of
// the same order gets a fast, clear 409 payment_in_progress; the database
// (paid_order_id UNIQUE, the conditional debit) is what keeps it paid once.
func (s *server) pay(w http.ResponseWriter, r *http.Request) {
	call, _ := idempotency.FromContext(r.Context())
	orderID := r.PathValue("id")
	var p sqlstore.Payment
	err := s.underLock(r.Context(), "order:"+orderID, false, func(fence int64) (err error) {
		p, _, err = s.cfg.Store.PayOrder(r.Context(), sqlstore.Payment{ID: newID("pay_"), OrderID: orderID, UserID: call.Scope.Principal, Key: call.Key, CreatedAt: time.Now().UnixMicro()}, fence)
		return err
	})
	if errors.Is(err, lock.ErrNotAcquired) {
		s.audit(r, "payment", "", 0, "in_progress")
		call.Forget() // transient: a retry with this key must run again, not replay this
		w.Header().Set("Retry-After", "1")
		problem(w, http.StatusConflict, "payment_in_progress", "Payment in progress", "another payment of this order is being processed; retry shortly")
		return
	}
	switch {
	case errors.Is(err, errLock), errors.Is(err, sqlstore.ErrStaleFence):
		s.audit(r, "payment", "", p.Amount, "busy")
		s.busy(w)
	case errors.Is(err, sqlstore.ErrNotFound):
		problem(w, http.StatusNotFound, "not_found", "Not found", "no such resource")
	case errors.Is(err, sqlstore.ErrAlreadyPaid):
		s.audit(r, "payment", "", p.Amount, "already_paid")
		problem(w, http.StatusConflict, "order_already_paid", "Order already paid", "this order has been paid")
	case errors.Is(err, sqlstore.ErrInsufficientFunds):
		s.audit(r, "payment", "", p.Amount, "insufficient_funds")
		problem(w, http.StatusUnprocessableEntity, "insufficient_funds", "Insufficient funds", "the balance does not cover this payment; nothing changed")
	case err != nil:
		s.internal(w, r, err)
	default:
		s.audit(r, "payment", p.ID, p.Amount, "paid")
		writeJSON(w, http.StatusCreated, map[string]any{"order_id": p.OrderID, "payment_id": p.ID, "status": "paid", "amount": p.Amount})
	}
}

func (s *server) listMovements(table string) func(http.ResponseWriter, *http.Request, sqlstore.User) {
	return func(w http.ResponseWriter, r *http.Request, u sqlstore.User) {
		ms, err := s.cfg.Store.Movements(r.Context(), table, u.ID, 1000)
		writeList(s, w, r, ms, err, movementJSON)
	}
}

func (s *server) getMovement(table string) func(http.ResponseWriter, *http.Request, sqlstore.User) {
	return func(w http.ResponseWriter, r *http.Request, u sqlstore.User) {
		m, err := s.cfg.Store.MovementByID(r.Context(), table, u.ID, r.PathValue("id"))
		writeOne(s, w, r, m, err, movementJSON)
	}
}
