package httpapi

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"runtime/debug"
	"strconv"
	"strings"
	"time"

	"github.com/onceguard/onceguard/cmd/onceguard/internal/app"
	"github.com/onceguard/onceguard/cmd/onceguard/internal/obs"
	"github.com/onceguard/onceguard/idempotency"
	"github.com/onceguard/onceguard/token"
	"github.com/prometheus/client_golang/prometheus"
)

// requestInfo is what a request's middlewares and handler learn, for its log line and metrics.
type requestInfo struct {
	userID, keyHash, outcome string
	route                    string       // the route pattern (the metric label)
	target                   http.Handler // what the router resolved
	body                     any          // the keyed request's body, decoded once by its fingerprint
	sessionHash              string       // the session's hash, when its check is the transaction's
	tokenUsed                bool         // a submit token passed the key check: its request ran
	handled                  bool         // the keyed handler ran (its transaction checks the session)
	released                 bool         // the key (and its token) were freed for a retry
	abort                    bool         // a panic after the status was sent: abort the answer
	status                   int
}

type requestInfoKey struct{}

func info(r *http.Request) *requestInfo {
	if i, ok := r.Context().Value(requestInfoKey{}).(*requestInfo); ok {
		return i
	}
	return &requestInfo{}
}

// statusWriter remembers the status a handler wrote, and adds the headers that depend on it.
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
		w.WriteHeader(http.StatusOK)
	}
	return w.ResponseWriter.Write(b)
}

// observe gives the request its id, logger and info, and writes its log line and metrics.
func (s *server) observe(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		id := obs.RequestID(r)
		w.Header().Set("X-Request-Id", id)
		in := &requestInfo{keyHash: obs.Hash(r.Header.Get("Idempotency-Key"))}
		log := s.log.With("request_id", id)
		r = r.WithContext(context.WithValue(app.WithLogger(r.Context(), log), requestInfoKey{}, in))
		sw := &statusWriter{ResponseWriter: w}
		next.ServeHTTP(sw, r)
		status := sw.status
		if in.abort {
			status = http.StatusInternalServerError
		}
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
			rm := s.requestMetrics(in.route, method, status)
			rm.count.Inc()
			rm.duration.Observe(obs.Since(start))
			// A submit token is consumed only if its request's answer was kept; one freed
			// for a retry is released, and counted consumed when a retry keeps an answer.
			switch {
			case in.tokenUsed && in.released:
				m.Tokens.WithLabelValues("released").Inc()
			case in.tokenUsed:
				m.Tokens.WithLabelValues("consumed").Inc()
			}
		}
		level := slog.LevelInfo
		if status >= 500 {
			level = slog.LevelWarn
		}
		if log.Enabled(r.Context(), level) {
			// Typed attributes, on the stack: a line on every request, without boxing.
			var buf [7]slog.Attr
			attrs := append(buf[:0], slog.String("method", method), slog.String("route", in.route), slog.Int("status", status),
				slog.Float64("duration_ms", float64(time.Since(start).Microseconds())/1000))
			if in.userID != "" {
				attrs = append(attrs, slog.String("user_id", in.userID))
			}
			if in.keyHash != "" {
				attrs = append(attrs, slog.String("key_hash", in.keyHash))
			}
			if in.outcome != "" {
				attrs = append(attrs, slog.String("idempotency", in.outcome))
			}
			log.LogAttrs(r.Context(), level, "request", attrs...)
		}
		if in.abort {
			panic(http.ErrAbortHandler) // see recoverPanic
		}
	})
}

// requestLabels are a request's metric labels: a route pattern, a method and a status, each
// from a bounded set (resolve's patterns, observe's methods, the answers the service writes).
type requestLabels struct {
	route, method string
	status        int
}

// requestCounters are the metrics of one requestLabels.
type requestCounters struct {
	count    prometheus.Counter
	duration prometheus.Observer
}

// requestMetrics returns labels' metrics, resolved once: WithLabelValues hashes every label on
// every call, on every request.
func (s *server) requestMetrics(route, method string, status int) *requestCounters {
	l := requestLabels{route, method, status}
	if c, ok := s.reqMetrics.Load(l); ok {
		return c.(*requestCounters)
	}
	m := s.cfg.Metrics
	c, _ := s.reqMetrics.LoadOrStore(l, &requestCounters{
		count:    m.HTTPRequests.WithLabelValues(route, method, strconv.Itoa(status)),
		duration: m.HTTPDuration.WithLabelValues(route, method),
	})
	return c.(*requestCounters)
}

// recoverPanic turns a handler's panic (a bug) into the contract's 500 internal, logged with
// its stack, instead of a dropped connection; the Idempotency-Key middleware has freed the key
// on its way up, so a retry runs again. If the status was already sent, the answer is aborted
// after its log line (http.ErrAbortHandler), so the client sees it broken, not short and whole.
func (s *server) recoverPanic(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		sw := w.(*statusWriter)
		defer func() {
			v := recover()
			if v == nil {
				return
			}
			if v == http.ErrAbortHandler {
				panic(v)
			}
			app.Logger(r.Context(), s.log).Error("handler panicked", "panic", fmt.Sprint(v), "stack", string(debug.Stack()))
			if sw.status == 0 {
				writeProblem(w, problemFor(app.CodeInternal, ""))
				return
			}
			info(r).abort = true
		}()
		next.ServeHTTP(w, r)
	})
}

// apiHeaders keeps API answers out of caches and from being sniffed into HTML (they carry users' text).
func apiHeaders(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasPrefix(r.URL.Path, "/api/") {
			h := w.Header()
			h.Set("Cache-Control", "no-store")
			h.Set("X-Content-Type-Options", "nosniff")
		}
		next.ServeHTTP(w, r)
	})
}

// rateLimit answers 429 rate_limited to an address over its rate, health and metrics aside.
func (s *server) rateLimit(next http.Handler) http.Handler {
	if s.rates == nil {
		return next
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch info(r).route {
		case "/healthz", "/readyz", "/metrics":
		default:
			if wait := s.rates.take(s.clientAddr(r), time.Now()); wait > 0 {
				tooMany(w, "rate_limited", "this address sends more requests than the service takes; slow down", wait)
				return
			}
		}
		next.ServeHTTP(w, r)
	})
}

type userKey struct{}

// userFrom is the signed-in user authed put in ctx.
func userFrom(ctx context.Context) app.User {
	u, _ := ctx.Value(userKey{}).(app.User)
	return u
}

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

// user is the request's signed-in user; app.ErrNotFound when there is none.
func (s *server) user(r *http.Request) (app.User, error) {
	u, err := s.app.SessionUser(r.Context(), sessionToken(r))
	if err == nil {
		info(r).userID = u.ID
	}
	return u, err
}

// sessionPrincipal is user from memory after a session's first request: the request's
// transaction checks the session is live (app.TxChecks.SessionHash), whose hash it keeps.
func (s *server) sessionPrincipal(r *http.Request) (app.User, error) {
	u, hash, err := s.app.SessionPrincipal(r.Context(), sessionToken(r))
	if err == nil {
		i := info(r)
		i.userID, i.sessionHash = u.ID, hash
	}
	return u, err
}

// authed answers 401 unauthenticated without a live session, else passes the user in the context.
func (s *server) authed(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u, err := s.user(r)
		if err != nil {
			s.fail(w, r, unauthenticated(err))
			return
		}
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), userKey{}, u)))
	})
}

// unauthenticated is err as an answer: no session is 401, a store failure stays itself.
func unauthenticated(err error) error {
	if app.ErrorCode(err) == app.CodeNotFound {
		return &app.Error{Code: app.CodeUnauthenticated, Message: "sign in first"}
	}
	return err
}

// keyed wraps a money route in its deadline and the Idempotency-Key middleware, with the
// contract's order of checks; fingerprint decodes the body once and keeps it for the handler.
//
// A withdrawal is Deferred: its key's record is created in the transaction that debits, with
// the session's check (app.TxChecks), and its principal comes from memory after a session's
// first request (app.Service.SessionPrincipal).
func (s *server) keyed(purpose string, fingerprint func(*http.Request, []byte) (string, error), next http.Handler) http.Handler {
	deferred := purpose == "withdrawal" && s.cfg.DeferKeys
	user := s.user
	if deferred {
		user = s.sessionPrincipal
	}
	h := idempotency.Middleware(idempotency.Config{
		Store: s.cfg.Keys, Tokens: s.tokens, Purpose: purpose, RequireToken: s.cfg.RequireToken[purpose],
		Windows: s.cfg.Windows, Window: s.window(purpose), TTL: s.cfg.KeyTTL, Lease: s.app.KeyLease(), MaxBody: MaxBody,
		Deferred: deferred,
		// The next token with each answer (Next-Submit-Token): a form submits again without
		// minting first. Signed tokens only, whose minting writes nothing.
		OfferToken: s.tokens.Signed(),
		Principal: func(r *http.Request) (string, error) {
			u, err := user(r)
			if err != nil && app.ErrorCode(err) != app.CodeNotFound {
				return "", s.problem(err)
			}
			return u.ID, err
		},
		Fingerprint: fingerprint,
		OnEvent:     s.keyEvent,
	})(s.ran(next))
	if deferred {
		// The principal came from memory: an answer the middleware gives before the debit's
		// transaction checked the session (a refusal, a next token, a replay) checks it first.
		inner := h
		h = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			inner.ServeHTTP(&liveWriter{ResponseWriter: w, s: s, r: r}, r)
		})
	}
	// The deadline comes first: the key's lease starts inside it.
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), s.app.RequestTimeout())
		defer cancel()
		h.ServeHTTP(w, r.WithContext(ctx))
	})
}

// keyIsToken reports whether the request's Idempotency-Key, as the middleware parses it (bare or
// quoted), is a submit token.
func keyIsToken(r *http.Request) bool {
	k, err := idempotency.ParseKey(r.Header["Idempotency-Key"])
	return err == nil && strings.HasPrefix(k, token.Prefix)
}

// window is a purpose's repeat-submit window: withdrawals and orders only.
func (s *server) window(purpose string) time.Duration {
	if purpose == "withdrawal" || purpose == "order" {
		return s.cfg.Window
	}
	return 0
}

// keyEvent counts and logs what the Idempotency-Key check decided.
func (s *server) keyEvent(r *http.Request, ev string) {
	if ev == "token_offered" { // besides the request's outcome, not one
		if m := s.cfg.Metrics; m != nil {
			m.Tokens.WithLabelValues("offered").Inc()
		}
		return
	}
	i := info(r)
	switch ev {
	case "new", "recovered":
		// Counted at the request's end (observe): consumed, or released when the answer is not kept.
		i.tokenUsed = keyIsToken(r)
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
		m.RepeatRejections.WithLabelValues(i.route).Inc()
	case "token_invalid":
		m.Tokens.WithLabelValues("invalid").Inc()
	case "token_foreign":
		m.Tokens.WithLabelValues("foreign").Inc()
	}
}

// ran notes in the request's info that the keyed handler ran.
func (s *server) ran(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		info(r).handled = true
		next.ServeHTTP(w, r)
	})
}

// liveWriter answers 401 unauthenticated in place of an answer the Idempotency-Key middleware
// gives, without running the handler, to a session that is no longer live (signed out on
// another instance, or expired, while this one remembered its user): no 400, no replay, no
// Next-Submit-Token for it. A store failure lets the answer through, a refusal or a replay of
// the session's own user.
type liveWriter struct {
	http.ResponseWriter
	s       *server
	r       *http.Request
	decided bool
	dropped bool // the middleware's answer, replaced
}

func (l *liveWriter) WriteHeader(code int) {
	if l.dropped {
		return
	}
	if !l.decided && code >= 200 { // an informational answer is not the answer
		l.decided = true
		if !info(l.r).handled && code != http.StatusUnauthorized && code != http.StatusRequestEntityTooLarge && code < 500 {
			if _, err := l.s.user(l.r); err != nil && app.ErrorCode(err) == app.CodeNotFound {
				l.dropped = true
				h := l.ResponseWriter.Header()
				for _, k := range []string{"Next-Submit-Token", "Next-Submit-Token-Expires", "Idempotent-Replayed", "Retry-After", "Content-Length", "Expires"} {
					h.Del(k)
				}
				writeProblem(l.ResponseWriter, problemFor(app.CodeUnauthenticated, "sign in first"))
				return
			}
		}
	}
	l.ResponseWriter.WriteHeader(code)
}

func (l *liveWriter) Write(b []byte) (int, error) {
	if !l.decided {
		l.WriteHeader(http.StatusOK)
	}
	if l.dropped {
		return len(b), nil
	}
	return l.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach the connection.
func (l *liveWriter) Unwrap() http.ResponseWriter { return l.ResponseWriter }
