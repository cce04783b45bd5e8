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
	"strings"
	"time"

	"github.com/onceguard/onceguard/cmd/onceguard/internal/gateway"
	"github.com/onceguard/onceguard/cmd/onceguard/internal/obs"
	"github.com/onceguard/onceguard/idempotency"
	idemsql "github.com/onceguard/onceguard/idempotency/sqlstore"
	"github.com/onceguard/onceguard/lock"
	"github.com/onceguard/onceguard/token"
)

// gatewayConfig is the gateway's configuration (docs/gateway.md).
type gatewayConfig struct {
	addr, upstream, db, dataDir, redis, requireToken                string
	principalHeader, principalCookie, keyField, logLevel, logFormat string
	routes                                                          routeList
	repeatWindow, keyTTL, keyLease, tokenTTL, upstreamTimeout       time.Duration
	dbConns                                                         int
}

// routeList is the repeatable --route: its default comes from
// ONCEGUARD_GATEWAY_ROUTES (routes separated by ';'), replaced as a whole
// by the first --route given.
type routeList struct {
	routes []string
	given  bool
}

func (l *routeList) String() string {
	if l == nil {
		return ""
	}
	return strings.Join(l.routes, "; ")
}

func (l *routeList) Set(v string) error {
	if !l.given {
		l.routes, l.given = nil, true
	}
	if _, err := gateway.ParseRoute(v); err != nil {
		return err
	}
	l.routes = append(l.routes, v)
	return nil
}

// gatewayFlags defines gateway's flags, each with its default from the
// environment variable named in brackets in its usage.
func gatewayFlags(env *envVars, stderr io.Writer) (*flag.FlagSet, *gatewayConfig) {
	fs := flag.NewFlagSet("gateway", flag.ContinueOnError)
	fs.SetOutput(stderr)
	c := &gatewayConfig{}
	for _, r := range strings.Split(env.str("ONCEGUARD_GATEWAY_ROUTES", ""), ";") {
		if r = strings.TrimSpace(r); r != "" {
			if _, err := gateway.ParseRoute(r); err != nil {
				env.bad("ONCEGUARD_GATEWAY_ROUTES", r, `routes "METHOD PATH [purpose]" separated by ';'`)
				continue
			}
			c.routes.routes = append(c.routes.routes, r)
		}
	}
	fs.StringVar(&c.addr, "addr", env.str("ONCEGUARD_GATEWAY_ADDR", "127.0.0.1:8088"), "listen address [ONCEGUARD_GATEWAY_ADDR]")
	fs.StringVar(&c.upstream, "upstream", env.str("ONCEGUARD_GATEWAY_UPSTREAM", ""), "URL of the service every request is proxied to; required [ONCEGUARD_GATEWAY_UPSTREAM]")
	fs.Var(&c.routes, "route", `a guarded route "METHOD PATH [purpose]" (PATH may hold {name} segments), repeatable [ONCEGUARD_GATEWAY_ROUTES]`)
	fs.StringVar(&c.db, "db", env.str("ONCEGUARD_GATEWAY_DB", ""), "database URL as for serve: sqlite:///path, postgres://..., mysql://... (default: SQLite under --data-dir) [ONCEGUARD_GATEWAY_DB]")
	fs.IntVar(&c.dbConns, "db-conns", env.int("ONCEGUARD_GATEWAY_DB_CONNS", 20), "largest number of open connections to PostgreSQL or MySQL [ONCEGUARD_GATEWAY_DB_CONNS]")
	fs.StringVar(&c.dataDir, "data-dir", env.str("ONCEGUARD_GATEWAY_DATA_DIR", "./data"), "data directory of the default SQLite database [ONCEGUARD_GATEWAY_DATA_DIR]")
	fs.StringVar(&c.redis, "redis", env.str("ONCEGUARD_GATEWAY_REDIS", ""), "Redis URL(s) as for serve: locks there, falling back to the database; the window stays in the database [ONCEGUARD_GATEWAY_REDIS]")
	fs.StringVar(&c.requireToken, "require-submit-token", env.str("ONCEGUARD_GATEWAY_REQUIRE_SUBMIT_TOKEN", "none"), "purposes whose routes accept only submit tokens, comma-separated, or none [ONCEGUARD_GATEWAY_REQUIRE_SUBMIT_TOKEN]")
	fs.StringVar(&c.principalHeader, "principal-header", env.str("ONCEGUARD_GATEWAY_PRINCIPAL_HEADER", ""), "header a trusted proxy in front sets to the user (X-User-Id) [ONCEGUARD_GATEWAY_PRINCIPAL_HEADER]")
	fs.StringVar(&c.principalCookie, "principal-cookie", env.str("ONCEGUARD_GATEWAY_PRINCIPAL_COOKIE", ""), "the upstream's session cookie (PHPSESSID), used hashed [ONCEGUARD_GATEWAY_PRINCIPAL_COOKIE]")
	fs.StringVar(&c.keyField, "key-field", env.str("ONCEGUARD_GATEWAY_KEY_FIELD", ""), "body field (form or JSON) carrying the key when there is no Idempotency-Key header (withdraw_token) [ONCEGUARD_GATEWAY_KEY_FIELD]")
	fs.DurationVar(&c.repeatWindow, "repeat-window", env.dur("ONCEGUARD_GATEWAY_REPEAT_WINDOW", 10*time.Second), "repeat-submit window, 0 off [ONCEGUARD_GATEWAY_REPEAT_WINDOW]")
	fs.DurationVar(&c.keyTTL, "key-ttl", env.dur("ONCEGUARD_GATEWAY_KEY_TTL", idempotency.DefaultTTL), "Idempotency-Key retention [ONCEGUARD_GATEWAY_KEY_TTL]")
	fs.DurationVar(&c.keyLease, "key-lease", env.dur("ONCEGUARD_GATEWAY_KEY_LEASE", 0), "how long a key in flight answers 409; must outlast --upstream-timeout by a quarter; 0: twice --upstream-timeout [ONCEGUARD_GATEWAY_KEY_LEASE]")
	fs.DurationVar(&c.tokenTTL, "token-ttl", env.dur("ONCEGUARD_GATEWAY_TOKEN_TTL", token.DefaultTTL), "submit token lifetime [ONCEGUARD_GATEWAY_TOKEN_TTL]")
	fs.DurationVar(&c.upstreamTimeout, "upstream-timeout", env.dur("ONCEGUARD_GATEWAY_UPSTREAM_TIMEOUT", gateway.DefaultUpstreamTimeout), "bound on a guarded request's upstream exchange, and on the wait for any answer's first byte [ONCEGUARD_GATEWAY_UPSTREAM_TIMEOUT]")
	fs.StringVar(&c.logLevel, "log-level", env.str("ONCEGUARD_GATEWAY_LOG_LEVEL", "info"), "debug, info, warn or error [ONCEGUARD_GATEWAY_LOG_LEVEL]")
	fs.StringVar(&c.logFormat, "log-format", env.str("ONCEGUARD_GATEWAY_LOG_FORMAT", "auto"), "json, text, or auto [ONCEGUARD_GATEWAY_LOG_FORMAT]")
	return fs, c
}

// runGateway is `onceguard gateway`: the service's stores (openDB,
// newCoordination, as serve opens them) under gateway.New, served until
// ctx ends (SIGTERM), then in-flight requests finished.
func runGateway(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	env := &envVars{getenv: getenv}
	fs, c := gatewayFlags(env, stderr)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if err := env.err(fs); err != nil {
		return fmt.Errorf("gateway: %w", err)
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("gateway: unexpected arguments %q", fs.Args())
	}
	log, err := obs.NewLogger(stderr, c.logFormat, c.logLevel)
	if err != nil {
		return err
	}
	up, err := url.Parse(c.upstream)
	if c.upstream == "" || err != nil || (up.Scheme != "http" && up.Scheme != "https") || up.Host == "" {
		return fmt.Errorf("gateway: --upstream %q: want the service's URL, http://host:port", c.upstream)
	}
	if (c.principalHeader == "") == (c.principalCookie == "") {
		return errors.New("gateway: name whose keys they are with exactly one of --principal-header and --principal-cookie")
	}
	if c.upstreamTimeout <= 0 {
		return fmt.Errorf("gateway: --upstream-timeout %v: want a positive duration", c.upstreamTimeout)
	}
	if c.keyLease == 0 {
		c.keyLease = gateway.DefaultLease(c.upstreamTimeout)
	}
	if !gateway.FitsLease(c.upstreamTimeout, c.keyLease) {
		return fmt.Errorf("gateway: --key-lease %v, --upstream-timeout %v: a key's lease must outlast its upstream exchange (want upstream-timeout x 1.25 < key-lease), or a retry could forward it twice", c.keyLease, c.upstreamTimeout)
	}
	if c.dbConns < 1 {
		return fmt.Errorf("gateway: --db-conns %d: want at least 1", c.dbConns)
	}
	var routes []gateway.Route
	for _, s := range c.routes.routes {
		r, err := gateway.ParseRoute(s)
		if err != nil {
			return fmt.Errorf("gateway: --route: %w", err)
		}
		routes = append(routes, r)
	}
	require := map[string]bool{}
	for _, p := range strings.Split(c.requireToken, ",") {
		if p = strings.TrimSpace(p); p != "" && p != "none" {
			require[p] = true
		}
	}
	db, dialect, where, err := openDB(serveConfig{db: c.db, dataDir: c.dataDir, dbConns: c.dbConns, lockTTL: 10 * time.Second})
	if err != nil {
		return err
	}
	defer db.Close()
	defer checkpoints(db, dialect)()
	keys, err := idemsql.New(db, dialect, nil)
	if err != nil {
		return err
	}
	if err := keys.Migrate(ctx); err != nil {
		return err
	}
	coord, err := newCoordination(db, dialect, c.redis, keys, nil, lock.Options{}, nil)
	if err != nil {
		return err
	}
	defer coord.close()
	g, err := gateway.New(gateway.Config{
		Upstream: up, Routes: routes, Keys: keys, Windows: coord.windows, RequireToken: require,
		PrincipalHeader: c.principalHeader, PrincipalCookie: c.principalCookie, KeyField: c.keyField,
		Window: c.repeatWindow, KeyTTL: c.keyTTL, KeyLease: c.keyLease, TokenTTL: c.tokenTTL, UpstreamTimeout: c.upstreamTimeout,
		Ping: db.PingContext, Components: coord.components(), Logger: log,
	})
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", c.addr)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: g, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 2 * time.Minute, MaxHeaderBytes: 32<<10 - 4096}
	fmt.Fprintf(stdout, "onceguard gateway %s: listening on http://%s; upstream %s; %d guarded routes; database %s; %s\n",
		version, ln.Addr(), redactURL(c.upstream), len(routes), where, coord.describe)
	log.Info("gateway listening", "version", version, "addr", "http://"+ln.Addr().String(), "upstream", redactURL(c.upstream),
		"routes", c.routes.String(), "database", where, "coordination", coord.describe)
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
		log.Info("shutting down: finishing in-flight requests")
		// In-flight guarded requests get their whole upstream exchange:
		// one cut off would leave its key's outcome unknown. At least 10s:
		// net/http counts a connection that never sent a request idle (and
		// closes it) only after 5s.
		sctx, cancel := context.WithTimeout(context.Background(), max(c.upstreamTimeout+5*time.Second, 10*time.Second))
		defer cancel()
		return srv.Shutdown(sctx)
	}
}
