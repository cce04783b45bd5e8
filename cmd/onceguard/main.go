// Command onceguard runs the onceguard reference service and its tools.
//
//	onceguard [serve] [flags]   the service (the default command)
//	onceguard psp [--addr A] [--notify U --notify-secret S] [--async]
//	                            the simulated payment provider over HTTP
//	onceguard storm [--target U] a duplicate storm against a running service
//	onceguard gateway --upstream U --route R ...
//	                            duplicate protection in front of any HTTP service
//	onceguard keys inspect|fail|answer ...
//	                            look at and settle a gateway key by hand
//	onceguard version           print the module path and version
//
// Every flag can also be set from the environment; see docs/operations.md.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"runtime/debug"
	"strings"
	"syscall"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // driver "pgx"
	"github.com/redis/go-redis/v9"
	_ "modernc.org/sqlite" // driver "sqlite"

	"github.com/onceguard/onceguard/cmd/onceguard/internal/app"
	"github.com/onceguard/onceguard/cmd/onceguard/internal/events"
	"github.com/onceguard/onceguard/cmd/onceguard/internal/httpapi"
	"github.com/onceguard/onceguard/cmd/onceguard/internal/money"
	"github.com/onceguard/onceguard/cmd/onceguard/internal/obs"
	"github.com/onceguard/onceguard/cmd/onceguard/internal/obs/backends"
	"github.com/onceguard/onceguard/cmd/onceguard/internal/psp"
	"github.com/onceguard/onceguard/cmd/onceguard/internal/sqlstore"
	"github.com/onceguard/onceguard/cmd/onceguard/internal/web"
	"github.com/onceguard/onceguard/idempotency"
	idemsql "github.com/onceguard/onceguard/idempotency/sqlstore"
	"github.com/onceguard/onceguard/lock"
	"github.com/onceguard/onceguard/lock/fallback"
	"github.com/onceguard/onceguard/token"
)

// modulePath and version name the main module of this binary: a release
// tag when it was built by `go install ...@vX.Y.Z`, "(devel)" in a checkout.
var modulePath, version = moduleVersion()

func moduleVersion() (path, version string) {
	path, version = "github.com/onceguard/onceguard", "(devel)"
	if bi, ok := debug.ReadBuildInfo(); ok {
		if bi.Main.Path != "" {
			path = bi.Main.Path
		}
		if bi.Main.Version != "" {
			version = bi.Main.Version
		}
	}
	return path, version
}

func main() {
	// go-redis logs dial failures on its own; the service reports Redis
	// being away through /readyz, the lock_fallback metrics and its own
	// log lines, so those would only be noise (and not JSON).
	redis.SetLogger(discardRedisLog{})
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr); err != nil {
		if !errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(os.Stderr, "onceguard:", err)
		}
		os.Exit(2)
	}
}

type discardRedisLog struct{}

func (discardRedisLog) Printf(context.Context, string, ...any) {}

// run is the whole program, with its environment passed in, so that tests
// can run it in process.
func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	cmd := "serve"
	if len(args) > 0 && len(args[0]) > 0 && args[0][0] != '-' {
		cmd, args = args[0], args[1:]
	}
	switch cmd {
	case "serve":
		return serve(ctx, args, getenv, stdout, stderr)
	case "psp":
		return servePSP(ctx, args, getenv, stdout, stderr)
	case "storm":
		return runStorm(ctx, args, getenv, stdout, stderr)
	case "gateway":
		return runGateway(ctx, args, getenv, stdout, stderr)
	case "keys":
		return runKeys(ctx, args, getenv, stdout, stderr)
	case "version":
		fmt.Fprintln(stdout, modulePath, version)
		return nil
	default:
		return fmt.Errorf("unknown command %q (want serve, psp, storm, gateway, keys or version)", cmd)
	}
}

// serveConfig is the service's configuration (docs/api.md, "Process").
type serveConfig struct {
	addr, db, dataDir, redis, pspURL, requireToken, currency, maxAmount               string
	tokenTTL, keyTTL, keyLease, requestTimeout, lockTTL, repeatWindow, reconcileEvery time.Duration
	dbConns, rateBurst, loginAttempts, signupLimit                                    int
	rateLimit                                                                         float64
	logLevel, logFormat, clientIPHeader, notifySecret, events                         string
	secureCookies, durableSettlements                                                 bool
}

// serveFlags defines serve's flags on a new flag set, each with its
// default from the environment variable named in brackets in its usage.
func serveFlags(env *envVars, stderr io.Writer) (*flag.FlagSet, *serveConfig) {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.SetOutput(stderr)
	c := &serveConfig{}
	fs.StringVar(&c.addr, "addr", env.str("ONCEGUARD_ADDR", "127.0.0.1:8080"), "listen address [ONCEGUARD_ADDR]")
	fs.StringVar(&c.db, "db", env.str("ONCEGUARD_DB", ""), "database URL: sqlite:///path, postgres://..., mysql://user:pass@tcp(host:port)/db (default: SQLite under --data-dir) [ONCEGUARD_DB]")
	fs.IntVar(&c.dbConns, "db-conns", env.int("ONCEGUARD_DB_CONNS", 20), "largest number of open connections to PostgreSQL or MySQL [ONCEGUARD_DB_CONNS]")
	fs.StringVar(&c.dataDir, "data-dir", env.str("ONCEGUARD_DATA_DIR", "./data"), "data directory [ONCEGUARD_DATA_DIR]")
	fs.StringVar(&c.redis, "redis", env.str("ONCEGUARD_REDIS", ""), "Redis URL (redis://host:port/0) for locks and the repeat window, or several comma-separated independent nodes (a quorum); the database is the fallback [ONCEGUARD_REDIS]")
	fs.StringVar(&c.pspURL, "psp", env.str("ONCEGUARD_PSP", ""), "external payment provider URL (default: simulated in process) [ONCEGUARD_PSP]")
	fs.DurationVar(&c.tokenTTL, "token-ttl", env.dur("ONCEGUARD_TOKEN_TTL", token.DefaultTTL), "submit token lifetime [ONCEGUARD_TOKEN_TTL]")
	fs.DurationVar(&c.keyTTL, "key-ttl", env.dur("ONCEGUARD_KEY_TTL", idempotency.DefaultTTL), "Idempotency-Key retention [ONCEGUARD_KEY_TTL]")
	fs.DurationVar(&c.keyLease, "key-lease", env.dur("ONCEGUARD_KEY_LEASE", idempotency.DefaultLease), "how long a key whose request is in flight answers 409; a crashed instance's keys run again after it [ONCEGUARD_KEY_LEASE]")
	fs.DurationVar(&c.requestTimeout, "request-timeout", env.dur("ONCEGUARD_REQUEST_TIMEOUT", 0), "deadline of a deposit, withdrawal, order or payment request; with a quarter of it more to record a settlement, it must end inside --key-lease, so a slow request never runs twice; 0: 3/5 of --key-lease [ONCEGUARD_REQUEST_TIMEOUT]")
	fs.DurationVar(&c.lockTTL, "lock-ttl", env.dur("ONCEGUARD_LOCK_TTL", 10*time.Second), "TTL of the per-user and per-order locks, renewed while held: how long a crashed holder blocks others; also bounds how long a database transaction waits on a row lock or stays idle [ONCEGUARD_LOCK_TTL]")
	fs.DurationVar(&c.repeatWindow, "repeat-window", env.dur("ONCEGUARD_REPEAT_WINDOW", 10*time.Second), "repeat-submit window, 0 off [ONCEGUARD_REPEAT_WINDOW]")
	fs.DurationVar(&c.reconcileEvery, "reconcile-interval", env.dur("ONCEGUARD_RECONCILE_INTERVAL", 5*time.Second), "how often pending deposits and withdrawals are settled with the provider [ONCEGUARD_RECONCILE_INTERVAL]")
	fs.StringVar(&c.maxAmount, "max-amount", env.str("ONCEGUARD_MAX_AMOUNT", "1000000.00"), "largest amount [ONCEGUARD_MAX_AMOUNT]")
	fs.StringVar(&c.requireToken, "require-submit-token", env.str("ONCEGUARD_REQUIRE_SUBMIT_TOKEN", "withdrawal"), "purposes that need submit tokens, comma-separated, or none [ONCEGUARD_REQUIRE_SUBMIT_TOKEN]")
	fs.StringVar(&c.currency, "currency", env.str("ONCEGUARD_CURRENCY", "CNY"), "currency [ONCEGUARD_CURRENCY]")
	fs.Float64Var(&c.rateLimit, "rate-limit", env.float("ONCEGUARD_RATE_LIMIT", 2000), "requests a second one client address may send (429 rate_limited over it), 0 off [ONCEGUARD_RATE_LIMIT]")
	fs.IntVar(&c.rateBurst, "rate-burst", env.int("ONCEGUARD_RATE_BURST", 4000), "requests one client address may send at once [ONCEGUARD_RATE_BURST]")
	fs.IntVar(&c.signupLimit, "signup-limit", env.int("ONCEGUARD_SIGNUP_LIMIT", 100), "sign-ups one client address may make in an hour before 429 too_many_signups, -1 off [ONCEGUARD_SIGNUP_LIMIT]")
	fs.IntVar(&c.loginAttempts, "login-attempts", env.int("ONCEGUARD_LOGIN_ATTEMPTS", 5), "failed sign-ins per username and address in 15 min before 429 too_many_attempts (4x per address, 10x per username), -1 off [ONCEGUARD_LOGIN_ATTEMPTS]")
	fs.BoolVar(&c.secureCookies, "secure-cookies", env.bool("ONCEGUARD_SECURE_COOKIES", false), "mark the session cookie Secure on every sign-in, for a service reached only over TLS through a proxy that sends neither X-Forwarded-Proto nor Forwarded; default: Secure when the request came over TLS or such a proxy says so [ONCEGUARD_SECURE_COOKIES]")
	fs.StringVar(&c.clientIPHeader, "client-ip-header", env.str("ONCEGUARD_CLIENT_IP_HEADER", ""), "header a trusted proxy sets to the client's address (e.g. X-Real-IP), for the limits; default the connection's address [ONCEGUARD_CLIENT_IP_HEADER]")
	fs.StringVar(&c.notifySecret, "psp-notify-secret", env.str("ONCEGUARD_PSP_NOTIFY_SECRET", ""), "secret of the provider's signed callbacks; turns on POST /api/v1/psp/notifications (default: off, 404) [ONCEGUARD_PSP_NOTIFY_SECRET]")
	fs.StringVar(&c.events, "events", env.str("ONCEGUARD_EVENTS", ""), "NATS URL (nats://HOST:PORT): publish an event for every deposit and withdrawal settled and every order paid to the JetStream stream ONCEGUARD, through an outbox written in the change's transaction (default: off, no events written) [ONCEGUARD_EVENTS]")
	fs.BoolVar(&c.durableSettlements, "durable-settlements", env.bool("ONCEGUARD_DURABLE_SETTLEMENTS", false), "PostgreSQL: make a request's settlement of a withdrawal that succeeded wait for its WAL flush too; default: that one commit is asynchronous (the debit's commit always waits; a settlement a crash of PostgreSQL loses is redone by the reconciler with the provider) [ONCEGUARD_DURABLE_SETTLEMENTS]")
	fs.StringVar(&c.logLevel, "log-level", env.str("ONCEGUARD_LOG_LEVEL", "info"), "debug, info, warn or error [ONCEGUARD_LOG_LEVEL]")
	fs.StringVar(&c.logFormat, "log-format", env.str("ONCEGUARD_LOG_FORMAT", "auto"), "json, text, or auto: text on a terminal, else JSON [ONCEGUARD_LOG_FORMAT]")
	return fs, c
}

func serve(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	env := &envVars{getenv: getenv}
	fs, cp := serveFlags(env, stderr)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if err := env.err(fs); err != nil {
		return err
	}
	c := *cp
	log, err := obs.NewLogger(stderr, c.logFormat, c.logLevel)
	if err != nil {
		return err
	}
	if c.keyLease < 10*time.Millisecond {
		return fmt.Errorf("--key-lease %v: want at least 10ms", c.keyLease)
	}
	if c.requestTimeout == 0 {
		c.requestTimeout = app.DefaultRequestTimeout(c.keyLease)
	}
	if !app.FitsLease(c.requestTimeout, c.keyLease) {
		return fmt.Errorf("--request-timeout %v, --key-lease %v: a keyed request (its deadline, then up to a quarter of it to record its settlement) must end inside its key's lease; want request-timeout x 1.25 < key-lease", c.requestTimeout, c.keyLease)
	}
	if c.lockTTL < 100*time.Millisecond {
		return fmt.Errorf("--lock-ttl %v: want at least 100ms", c.lockTTL)
	}
	if c.rateLimit < 0 || c.rateBurst < 1 {
		return fmt.Errorf("--rate-limit %v, --rate-burst %d: want a rate >= 0 and a burst >= 1", c.rateLimit, c.rateBurst)
	}
	if c.reconcileEvery <= 0 {
		return fmt.Errorf("--reconcile-interval %v: want a positive duration", c.reconcileEvery)
	}
	if c.dbConns < 1 {
		return fmt.Errorf("--db-conns %d: want at least 1", c.dbConns)
	}
	maxAmount, err := money.Parse(c.maxAmount)
	if err != nil || maxAmount <= 0 || maxAmount > app.MaxAmountLimit {
		return fmt.Errorf("--max-amount %q: want an amount like 1000000.00, at most %s", c.maxAmount, app.MaxAmountLimit)
	}
	require := map[string]bool{}
	for _, p := range strings.Split(c.requireToken, ",") {
		switch p = strings.TrimSpace(p); {
		case p == "" || p == "none":
		case httpapi.Purpose(p):
			require[p] = true
		default: // a typo must not quietly turn the protection off
			return fmt.Errorf("--require-submit-token %q: %q is not a purpose; want a comma-separated list of withdrawal, deposit, order, payment, or none", c.requireToken, p)
		}
	}
	if c.events != "" {
		if err := events.CheckURL(c.events); err != nil {
			return err
		}
	}
	db, dialect, where, err := openDB(c)
	if err != nil {
		return err
	}
	defer db.Close()
	defer checkpoints(db, dialect)()
	if err := sqlstore.Migrate(ctx, db, dialect); err != nil {
		return err
	}
	keys, err := idemsql.New(db, dialect, nil)
	if err != nil {
		return err
	}
	if err := keys.Migrate(ctx); err != nil {
		return err
	}
	metrics := obs.NewMetrics()
	timedKeys := backends.TimeKeys(metrics, keys) // database latency of keys, windows and tokens
	var provider psp.Provider = &psp.Sim{}
	pspWhere := "simulated in process"
	if c.pspURL != "" {
		pc := psp.NewClient(c.pspURL, nil)
		defer pc.Close() // deferred first, so it runs after the server and the reconciler stopped
		provider, pspWhere = pc, c.pspURL
	}
	provider = obs.Provider{Provider: provider, Metrics: metrics}
	var coord *coordination
	coord, err = newCoordination(db, dialect, c.redis, timedKeys, metrics.TimeLockBackend,
		lock.Options{Observe: metrics.LockObserver(func() string { return coord.backend() })},
		&fallback.Options{OnStateChange: backends.FallbackObserver(metrics, log)})
	if err != nil {
		return err
	}
	defer coord.close()
	comps := coord.components()
	comps = append(comps, httpapi.Component{Name: "provider", Check: func(ctx context.Context) (string, bool) {
		if _, err := provider.Lookup(ctx, "readyz-probe"); err != nil && !errors.Is(err, psp.ErrNotFound) {
			return "unreachable", false
		}
		return "ok", true
	}})
	store := sqlstore.Open(db, dialect)
	store.Observe = metrics.DBObserver()
	store.ObserveCommit = metrics.SQLiteCommitObserver()
	store.Records = timedKeys // the key's record completes in the settlement's transaction
	store.AsyncSettle = !c.durableSettlements
	store.BatchSettle = true   // PostgreSQL: concurrent settlements share a commit
	store.BatchDebit = true    // PostgreSQL: concurrent debits share a commit
	store.BatchSessions = true // PostgreSQL: concurrent session checks share a round trip
	// Submit tokens are signed with a key every instance reads from the database: minting one
	// writes nothing, and its first use is bound by the record it creates.
	tokenKey, err := store.Secret(ctx, "submit_tokens")
	if err != nil {
		return fmt.Errorf("database: the submit tokens' key: %w", err)
	}
	var relay *events.Relay
	eventsWhere := "off"
	if c.events != "" {
		// Connects in the background when NATS does not answer: an outage
		// delays the events (they wait in the outbox), never the service.
		relay, err = events.Open(events.Config{URL: c.events, DB: db, Dialect: dialect, Metrics: metrics, Logger: log})
		if err != nil {
			return err
		}
		defer relay.Close()           // after the relay stopped (deferred below)
		store.Events = relay.Writer() // each settlement and payment writes its event in its transaction
		comps = append(comps, httpapi.Component{Name: "events", Check: relay.Check})
		eventsWhere = c.events
	} else {
		comps = append(comps, httpapi.Component{Name: "events", Check: func(context.Context) (string, bool) { return "not configured", true }})
	}
	svc := app.New(app.Config{
		Store: store, Provider: psp.Port(provider), Currency: c.currency, MaxAmount: maxAmount,
		Locks: coord.locks, LockTTL: c.lockTTL, LockBackend: coord.backend,
		KeyLease: c.keyLease, RequestTimeout: c.requestTimeout, SessionTTL: 24 * time.Hour,
		Logger: log, Metrics: metrics, NotifyMetrics: metrics,
	})
	handler := httpapi.New(httpapi.Config{
		App: svc, Keys: timedKeys, RequireToken: require, Window: c.repeatWindow, KeyTTL: c.keyTTL, TokenTTL: c.tokenTTL,
		Ping: db.PingContext, DeferKeys: true, TokenKey: tokenKey, Web: web.Handler(), Windows: coord.windows, Components: comps,
		Metrics: metrics, Logger: log,
		RateLimit: c.rateLimit, RateBurst: c.rateBurst, LoginAttempts: c.loginAttempts, SignupLimit: c.signupLimit, ClientIPHeader: c.clientIPHeader, SecureCookies: c.secureCookies,
		NotifySecret: []byte(c.notifySecret),
	})
	ln, err := net.Listen("tcp", c.addr)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: handler, ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 30 * time.Second,
		WriteTimeout: max(30*time.Second, c.requestTimeout+c.requestTimeout/4+5*time.Second), // the answer of a request that used its whole deadline
		// net/http allows MaxHeaderBytes + 4096 (its read buffer's slack): 32 KiB in all.
		IdleTimeout: 2 * time.Minute, MaxHeaderBytes: 32<<10 - 4096}
	fmt.Fprintf(stdout, "onceguard %s: listening on http://%s; database %s (keys and submit tokens too); %s; payment provider %s\n",
		version, ln.Addr(), where, coord.describe, pspWhere)
	log.Info("listening", "version", version, "addr", "http://"+ln.Addr().String(), "database", where, "coordination", coord.describe, "provider", pspWhere, "events", eventsWhere)
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	// The reconciler settles what a provider timeout left pending; it stops before the database closes.
	rctx, stopReconciler := context.WithCancel(ctx)
	reconciled := make(chan struct{})
	go func() {
		defer close(reconciled)
		(&app.Reconciler{Service: svc, Limit: 100, Metrics: metrics}).Run(rctx, c.reconcileEvery)
	}()
	defer func() { stopReconciler(); <-reconciled }()
	if relay != nil { // the outbox's relay; it too stops before the database closes
		relayed := make(chan struct{})
		go func() {
			defer close(relayed)
			relay.Run(rctx)
		}()
		defer func() { stopReconciler(); <-relayed }()
	}
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
		log.Info("shutting down: finishing in-flight requests")
		sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		return srv.Shutdown(sctx) // finishes in-flight requests
	}
}

// pspConfig is the simulated provider's configuration.
type pspConfig struct {
	addr, notify, notifySecret string
	async                      bool
	settleAfter                time.Duration
}

// pspFlags defines psp's flags.
func pspFlags(env *envVars, stderr io.Writer) (*flag.FlagSet, *pspConfig) {
	fs := flag.NewFlagSet("psp", flag.ContinueOnError)
	fs.SetOutput(stderr)
	c := &pspConfig{}
	fs.StringVar(&c.addr, "addr", env.str("ONCEGUARD_PSP_ADDR", "127.0.0.1:8090"), "listen address [ONCEGUARD_PSP_ADDR]")
	fs.StringVar(&c.notify, "notify", env.str("ONCEGUARD_PSP_NOTIFY", ""), "URL to POST signed callbacks to, one per settled operation (default: none sent) [ONCEGUARD_PSP_NOTIFY]")
	fs.StringVar(&c.notifySecret, "notify-secret", env.str("ONCEGUARD_PSP_NOTIFY_SECRET", ""), "secret the callbacks' Onceguard-Signature is made with; required with --notify [ONCEGUARD_PSP_NOTIFY_SECRET]")
	fs.BoolVar(&c.async, "async", env.bool("ONCEGUARD_PSP_ASYNC", false), "answer operations pending at once and settle them --settle-after later [ONCEGUARD_PSP_ASYNC]")
	fs.DurationVar(&c.settleAfter, "settle-after", env.dur("ONCEGUARD_PSP_SETTLE_AFTER", psp.DefaultSettleAfter), "how long an --async operation stays pending [ONCEGUARD_PSP_SETTLE_AFTER]")
	return fs, c
}

// servePSP runs the simulated payment provider over HTTP until ctx ends.
func servePSP(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	env := &envVars{getenv: getenv}
	fs, c := pspFlags(env, stderr)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if err := env.err(fs); err != nil {
		return err
	}
	sim := &psp.Sim{Async: c.async, SettleAfter: c.settleAfter}
	if c.settleAfter <= 0 {
		return fmt.Errorf("--settle-after %v: want a positive duration", c.settleAfter)
	}
	if c.notify != "" {
		if u, err := url.Parse(c.notify); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return fmt.Errorf("--notify %q: want an http:// or https:// URL", c.notify)
		}
		if c.notifySecret == "" {
			return errors.New("--notify needs --notify-secret: the service refuses unsigned callbacks")
		}
		sim.Notifier = &psp.Notifier{URL: c.notify, Secret: []byte(c.notifySecret)}
	}
	ln, err := net.Listen("tcp", c.addr)
	if err != nil {
		return err
	}
	// Settlements and callbacks stop after the server: none is left running.
	simCtx, stopSim := context.WithCancel(context.WithoutCancel(ctx))
	simDone := make(chan struct{})
	go func() {
		defer close(simDone)
		sim.Run(simCtx)
	}()
	defer func() { stopSim(); <-simDone }()
	srv := &http.Server{Handler: psp.Handler(sim), ReadHeaderTimeout: 5 * time.Second}
	mode := "settling at once"
	if c.async {
		mode = "settling after " + c.settleAfter.String()
	}
	notify := "no callbacks"
	if c.notify != "" {
		notify = "signed callbacks" // the address comes last and alone: scripts read it
	}
	fmt.Fprintf(stdout, "onceguard psp: simulated payment provider (%s, %s) on http://%s\n", mode, notify, ln.Addr())
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	// Longer than the 5s net/http waits before it counts a connection that
	// never sent a request as idle: such a connection, made just before the
	// shutdown, is closed, not waited on until the deadline.
	sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return srv.Shutdown(sctx)
}
