package conformance_test

import (
	"context"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/gin-gonic/gin"
	khttp "github.com/go-kratos/kratos/v2/transport/http"
	"github.com/labstack/echo/v4"
	"github.com/labstack/echo/v4/middleware"
	"github.com/zeromicro/go-zero/core/conf"
	"github.com/zeromicro/go-zero/core/logx"
	"github.com/zeromicro/go-zero/rest"

	"github.com/onceguard/onceguard/idempotency"
	"github.com/onceguard/onceguard/idempotency/adaptertest"
	"github.com/onceguard/onceguard/idempotency/idemecho"
	"github.com/onceguard/onceguard/idempotency/idemgin"
	"github.com/onceguard/onceguard/idempotency/idemkratos"
	"github.com/onceguard/onceguard/idempotency/idemzero"
)

// The gin, Echo, go-zero and kratos adapters on every store: each
// server as its module's own conformance test starts it.
func init() {
	adapters = append(adapters, []struct {
		name  string
		start adaptertest.Start
	}{
		{"gin", startGin},
		{"echo", startEcho},
		{"go-zero", startZero},
		{"kratos", startKratos},
	}...)
}

func config(cfg adaptertest.Config) idempotency.Config {
	return idempotency.Config{Store: cfg.Store, Tokens: cfg.Tokens, Purpose: cfg.Purpose,
		Window: cfg.Window, Lease: cfg.Lease, Principal: principal}
}

// serveHTTP serves h on a loopback listener until t ends.
func serveHTTP(t *testing.T, h http.Handler) string {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second, ErrorLog: quiet}
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(func() { _ = srv.Close() })
	return "http://" + lis.Addr().String()
}

func startGin(t *testing.T, cfg adaptertest.Config, app http.Handler) string {
	gin.SetMode(gin.ReleaseMode)
	r := gin.New()
	r.Use(gin.RecoveryWithWriter(io.Discard), idemgin.New(idempotency.Options[*gin.Context]{
		Store: cfg.Store, Tokens: cfg.Tokens, Purpose: cfg.Purpose, Window: cfg.Window, Lease: cfg.Lease,
		Principal: func(c *gin.Context) (string, error) { return c.GetHeader("X-User"), nil },
	}))
	r.Any("/*path", gin.WrapH(app))
	return serveHTTP(t, r)
}

func startEcho(t *testing.T, cfg adaptertest.Config, app http.Handler) string {
	e := echo.New()
	e.HideBanner, e.HidePort = true, true
	e.Logger.SetOutput(io.Discard)
	e.Use(middleware.Recover(), idemecho.New(idempotency.Options[echo.Context]{
		Store: cfg.Store, Tokens: cfg.Tokens, Purpose: cfg.Purpose, Window: cfg.Window, Lease: cfg.Lease,
		Principal: func(c echo.Context) (string, error) { return c.Request().Header.Get("X-User"), nil },
	}))
	e.Any("/*", echo.WrapHandler(app))
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	e.Listener = lis
	done := make(chan struct{})
	go func() { defer close(done); _ = e.Start("") }()
	t.Cleanup(func() { _ = e.Close(); <-done })
	return "http://" + lis.Addr().String()
}

// startZero serves go-zero's router with its default chain (less the dev
// server on :6060, logs and CPU load shedding) on a loopback listener:
// rest.Server.Start listens on a configured port only.
func startZero(t *testing.T, cfg adaptertest.Config, app http.Handler) string {
	var c rest.RestConf
	if err := conf.FillDefault(&c); err != nil {
		t.Fatal(err)
	}
	c.Log.Mode, c.Log.Stat = "console", false
	c.DevServer.Enabled = false
	c.Timeout = 30_000 // ms: a loaded machine must not cut a handler short
	c.Middlewares.Shedding = false
	c.Middlewares.Log, c.Middlewares.Trace, c.Middlewares.Prometheus, c.Middlewares.Metrics = false, false, false, false
	server, err := rest.NewServer(c)
	if err != nil {
		t.Fatal(err)
	}
	logx.Disable()
	server.Use(idemzero.New(config(cfg)))
	// No catch-all in go-zero's router: a route a depth, each segment a
	// path variable, for every method.
	for _, m := range []string{http.MethodGet, http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete} {
		server.AddRoute(rest.Route{Method: m, Path: "/", Handler: app.ServeHTTP})
		var p strings.Builder
		for i := range 8 {
			p.WriteString("/:p")
			p.WriteByte(byte('0' + i))
			server.AddRoute(rest.Route{Method: m, Path: p.String(), Handler: app.ServeHTTP})
		}
	}
	h, err := rest.NewServerless(server)
	if err != nil {
		t.Fatal(err)
	}
	return serveHTTP(t, http.HandlerFunc(h.Serve))
}

func startKratos(t *testing.T, cfg adaptertest.Config, app http.Handler) string {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := khttp.NewServer(khttp.Listener(lis), khttp.Timeout(30*time.Second), khttp.Filter(idemkratos.Filter(config(cfg))))
	srv.HandlePrefix("/", app)
	srv.ErrorLog = quiet
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Start(context.Background()) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Stop(ctx)
		<-done
	})
	return "http://" + lis.Addr().String()
}
