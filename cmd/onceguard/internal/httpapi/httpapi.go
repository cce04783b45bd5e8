// Package httpapi is the reference service's HTTP layer (the contract of
// docs/api.md): it decodes a request, calls app.Service and encodes the
// answer, or maps the error through one code table.
package httpapi

import (
	"context"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/onceguard/onceguard/cmd/onceguard/internal/app"
	"github.com/onceguard/onceguard/cmd/onceguard/internal/obs"
	"github.com/onceguard/onceguard/idempotency/idemstore"
	"github.com/onceguard/onceguard/token"
)

// Config wires the service's HTTP layer.
type Config struct {
	App          *app.Service        // the operations (nil: one with no store, which serves only the routing)
	Keys         idemstore.FullStore // Idempotency-Key records, submit tokens, repeat window
	RequireToken map[string]bool     // purposes whose routes take only submit tokens
	Window       time.Duration       // repeat-submit window (0: off)
	KeyTTL       time.Duration
	TokenTTL     time.Duration
	Ping         func(context.Context) error // database liveness, for /readyz
	Windows      idemstore.WindowStore       // the repeat-submit window (nil: Keys)
	Components   []Component                 // more /readyz components (Redis, the provider)
	// DeferKeys creates a withdrawal's Idempotency-Key record in the transaction that debits
	// (idempotency.Options.Deferred), with the session's check: Keys must be the SQL key store
	// the App's store creates records with (sqlstore.Store.Records).
	DeferKeys bool
	// TokenKey, if set, signs submit tokens instead of storing them (token.Options.Key): minting
	// one writes nothing, and its one-time use is the record of the request it keys. Keys must
	// bind signed tokens (idemstore.SignedTokenStore). Every instance needs the same key.
	TokenKey []byte
	Metrics  *obs.Metrics // served at /metrics and updated (nil: none)
	Logger   *slog.Logger // request lines (nil: none)

	// RateLimit is the requests a second one client address may send, RateBurst at once (0: no limit).
	RateLimit float64
	RateBurst int
	// LoginAttempts is how many failed sign-ins one (username, address) may have in 15 minutes,
	// an address 4 and a username 10 times as many; 0: 5, negative: off.
	// The username's limit spares an address with no failure and a pair that signed in before,
	// so that no one can lock an owner out.
	LoginAttempts int
	// SignupLimit is how many sign-ups that reach the password hash one address may make in an
	// hour (0: 100, negative: off).
	SignupLimit int
	// ClientIPHeader names the header a trusted proxy sets to the client's address, for the
	// limits (its last value counts; "": the connection's address).
	ClientIPHeader string
	// SecureCookies marks the session cookie Secure on every sign-in, not only on requests that
	// came over TLS or through a proxy that says so.
	SecureCookies bool
	// NotifySecret turns on POST /api/v1/psp/notifications, the provider's signed callbacks
	// (webhook.Onceguard with this secret; nil: the route answers 404).
	NotifySecret []byte
	Web          http.Handler // serves / and /static/... (nil: 404)
}

// A Component is one part /readyz reports besides the database; an
// unhealthy one makes the service degraded, still ready, as only the
// database is needed to serve.
type Component struct {
	Name  string
	Check func(context.Context) (status string, healthy bool)
}

// SessionCookie is the name of the session cookie.
const SessionCookie = "onceguard_session"

type server struct {
	cfg     Config
	app     *app.Service
	log     *slog.Logger
	handler http.Handler // the middlewares around the router, composed once

	rates                           *rates
	loginPair, loginAddr, loginUser *failures
	loginKnown                      *failures // (username, address) pairs that signed in, 30 days
	signups                         *failures // per client address, an hour
	tokens                          *token.Tokens
	routes                          map[string]map[string]http.Handler // path -> method -> handler
	reqMetrics                      sync.Map                           // requestLabels -> *requestCounters
}

// New returns the service's HTTP handler (docs/api.md): health, users,
// sessions, the account, submit tokens, deposits, withdrawals, the ledger,
// orders and their payment; other paths answer 404 not_found.
func New(cfg Config) http.Handler {
	if cfg.App == nil {
		cfg.App = app.New(app.Config{})
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
	s := &server{cfg: cfg, app: cfg.App, log: cfg.Logger, rates: newRates(cfg.RateLimit, cfg.RateBurst),
		tokens: token.New(cfg.Keys, &token.Options{TTL: cfg.TokenTTL, Key: cfg.TokenKey}), routes: map[string]map[string]http.Handler{}}
	if n := cfg.LoginAttempts; n > 0 {
		s.loginPair = newFailures(n, 15*time.Minute)
		s.loginAddr = newFailures(4*n, 15*time.Minute)
		s.loginUser = newFailures(10*n, 15*time.Minute)
		s.loginKnown = newFailures(1, 30*24*time.Hour)
	}
	if n := cfg.SignupLimit; n > 0 {
		s.signups = newFailures(n, time.Hour)
	}
	s.routeAll()
	s.compose()
	return s
}

// compose builds the middlewares around the router, once.
func (s *server) compose() {
	s.handler = chain(http.HandlerFunc(s.dispatch), s.observe, s.recoverPanic, apiHeaders, s.resolve, s.rateLimit)
}

// routeAll registers every route.
func (s *server) routeAll() {
	s.handle("GET", "/healthz", http.HandlerFunc(healthz))
	s.handle("GET", "/readyz", http.HandlerFunc(s.readyz))
	if s.cfg.Metrics != nil {
		s.handle("GET", "/metrics", s.cfg.Metrics.Handler())
	}
	s.handle("POST", "/api/v1/users", http.HandlerFunc(s.createUser))
	s.handle("POST", "/api/v1/sessions", http.HandlerFunc(s.createSession))
	s.handle("DELETE", "/api/v1/sessions/current", s.authed(http.HandlerFunc(s.deleteSession)))
	s.handle("GET", "/api/v1/account", s.authed(http.HandlerFunc(s.account)))
	s.handle("GET", "/api/v1/ledger", s.authed(http.HandlerFunc(s.ledger)))
	s.handle("POST", "/api/v1/submit-tokens", s.authed(http.HandlerFunc(s.createSubmitToken)))
	s.handle("POST", "/api/v1/deposits", s.keyed("deposit", s.amountFingerprint("deposit"), http.HandlerFunc(s.deposit)))
	s.handle("POST", "/api/v1/withdrawals", s.keyed("withdrawal", s.amountFingerprint("withdrawal"), http.HandlerFunc(s.withdraw)))
	s.handle("GET", "/api/v1/deposits", s.authed(s.listMovements(app.Deposit)))
	s.handle("GET", "/api/v1/deposits/{id}", s.authed(s.getMovement(app.Deposit)))
	s.handle("GET", "/api/v1/withdrawals", s.authed(s.listMovements(app.Withdrawal)))
	s.handle("GET", "/api/v1/withdrawals/{id}", s.authed(s.getMovement(app.Withdrawal)))
	s.handle("POST", "/api/v1/orders", s.keyed("order", s.orderFingerprint, http.HandlerFunc(s.createOrder)))
	s.handle("GET", "/api/v1/orders", s.authed(http.HandlerFunc(s.listOrders)))
	s.handle("GET", "/api/v1/orders/{id}", s.authed(http.HandlerFunc(s.getOrder)))
	s.handle("POST", "/api/v1/orders/{id}/payment", s.keyed("payment", s.paymentFingerprint, http.HandlerFunc(s.pay)))
	if len(s.cfg.NotifySecret) > 0 {
		// No CSRF or content type check: the signature comes first, and a provider has no cookie.
		s.routes["/api/v1/psp/notifications"] = map[string]http.Handler{"POST": s.notifications()}
	}
}

// ServeHTTP serves r through the middlewares and the router.
func (s *server) ServeHTTP(w http.ResponseWriter, r *http.Request) { s.handler.ServeHTTP(w, r) }

// chain wraps h in mws, the first outermost.
func chain(h http.Handler, mws ...func(http.Handler) http.Handler) http.Handler {
	for i := len(mws) - 1; i >= 0; i-- {
		h = mws[i](h)
	}
	return h
}
