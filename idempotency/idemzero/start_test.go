package idemzero_test

import (
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/zeromicro/go-zero/core/conf"
	"github.com/zeromicro/go-zero/core/logx"
	"github.com/zeromicro/go-zero/rest"

	"github.com/onceguard/onceguard/idempotency"
	"github.com/onceguard/onceguard/idempotency/adaptertest"
	"github.com/onceguard/onceguard/idempotency/idemzero"
	"github.com/onceguard/onceguard/idempotency/memstore"
)

// config is what the conformance suite asks of the adapter.
type config = adaptertest.Config

func options(cfg config) idempotency.Config {
	return idempotency.Config{
		Store: cfg.Store, Tokens: cfg.Tokens, Purpose: cfg.Purpose, Window: cfg.Window, Lease: cfg.Lease,
		Principal: func(r *http.Request) (string, error) { return r.Header.Get("X-User"), nil },
	}
}

// newServer returns a go-zero server with its default configuration
// (conf.FillDefault: Recover, Timeout, MaxBytes, MaxConns, ... in front of
// the routes) but for logs, a timeout long enough for a loaded test
// machine, and CPU load shedding (it answers 503 when the shared
// machine is busy, a flake unrelated to the guard), with the guard of
// cfg on every route (none for nil).
func newServer(t testing.TB, cfg *idempotency.Config, opts ...rest.RunOption) *rest.Server {
	var c rest.RestConf
	if err := conf.FillDefault(&c); err != nil {
		t.Fatal(err)
	}
	c.Log.Mode, c.Log.Stat = "console", false
	c.DevServer.Enabled = false // on by default: a pprof and metrics server on :6060
	c.Timeout = 30_000          // ms
	c.Middlewares.Shedding = false
	c.Middlewares.Log, c.Middlewares.Trace, c.Middlewares.Prometheus, c.Middlewares.Metrics = false, false, false, false
	server, err := rest.NewServer(c, opts...)
	if err != nil {
		t.Fatal(err)
	}
	logx.Disable() // after NewServer, whose SetUp starts logging
	if cfg != nil {
		server.Use(idemzero.New(*cfg))
	}
	return server
}

// anyRoutes routes every method and every path up to 8 segments to h:
// go-zero's router has no catch-all, so one route a depth, each segment
// a path variable.
func anyRoutes(h http.HandlerFunc) []rest.Route {
	var routes []rest.Route
	for _, m := range []string{http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete, http.MethodOptions} {
		routes = append(routes, rest.Route{Method: m, Path: "/", Handler: h})
		var p strings.Builder
		for i := range 8 {
			p.WriteString("/:p")
			p.WriteByte(byte('0' + i))
			routes = append(routes, rest.Route{Method: m, Path: p.String(), Handler: h})
		}
	}
	return routes
}

// start serves app behind the guard on a go-zero server, for every
// method and path. The server is go-zero's router with its whole chain
// (rest.NewServerless) on an http.Server of a loopback listener: Start
// listens on a configured port only, and exits the process on an error.
func start(t *testing.T, cfg config, app http.Handler) string {
	o := options(cfg)
	return startConfig(t, &o, app)
}

func startConfig(t *testing.T, o *idempotency.Config, app http.Handler) string {
	server := newServer(t, o)
	server.AddRoutes(anyRoutes(app.ServeHTTP))
	h, err := rest.NewServerless(server)
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(h.Serve), ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(func() { _ = srv.Close() })
	return "http://" + lis.Addr().String()
}

// startKeyOptional is start with KeyOptional, telling unprotected about
// each "unprotected" event.
func startKeyOptional(t *testing.T, unprotected func(), app http.Handler) string {
	o := options(config{Store: &memstore.Store{}})
	o.KeyOptional = true
	o.OnEvent = func(_ *http.Request, ev string) {
		if ev == "unprotected" {
			unprotected()
		}
	}
	return startConfig(t, &o, app)
}
