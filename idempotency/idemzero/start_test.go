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
	"github.com/onceguard/onceguard/idempotency/idemstore"
	"github.com/onceguard/onceguard/idempotency/idemzero"
	"github.com/onceguard/onceguard/token"
)

// config is adaptertest.Config's shape.
type config struct {
	Store   idemstore.FullStore
	Tokens  *token.Tokens
	Purpose string
	Window  time.Duration
	Lease   time.Duration
}

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
// machine is busy, a flake unrelated to the guard), with the guard on
// every route.
func newServer(t testing.TB, cfg config) *rest.Server {
	var c rest.RestConf
	if err := conf.FillDefault(&c); err != nil {
		t.Fatal(err)
	}
	c.Log.Mode, c.Log.Stat = "console", false
	c.Timeout = 30_000 // ms
	c.Middlewares.Shedding = false
	c.Middlewares.Log, c.Middlewares.Trace, c.Middlewares.Prometheus, c.Middlewares.Metrics = false, false, false, false
	logx.Disable()
	server, err := rest.NewServer(c)
	if err != nil {
		t.Fatal(err)
	}
	server.Use(idemzero.New(options(cfg)))
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
	server := newServer(t, cfg)
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
