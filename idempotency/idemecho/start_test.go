package idemecho_test

import (
	"errors"
	"io"
	"net"
	"net/http"
	"testing"

	"github.com/labstack/echo/v4"
	"github.com/labstack/echo/v4/middleware"

	"github.com/onceguard/onceguard/idempotency"
	"github.com/onceguard/onceguard/idempotency/adaptertest"
	"github.com/onceguard/onceguard/idempotency/idemecho"
	"github.com/onceguard/onceguard/idempotency/memstore"
)

// config is what the conformance suite asks of the adapter.
type config = adaptertest.Config

func options(cfg config) idempotency.Options[echo.Context] {
	return idempotency.Options[echo.Context]{
		Store: cfg.Store, Tokens: cfg.Tokens, Purpose: cfg.Purpose, Window: cfg.Window, Lease: cfg.Lease,
		Principal: func(c echo.Context) (string, error) { return c.Request().Header.Get("X-User"), nil },
	}
}

func newEcho() *echo.Echo {
	e := echo.New()
	e.HideBanner, e.HidePort = true, true
	e.Logger.SetOutput(io.Discard)
	return e
}

// start serves app behind the guard on a real Echo server (e.Start on a
// loopback listener), for every method and path, with Recover in front
// as a service has it.
func start(t *testing.T, cfg config, app http.Handler) string {
	e := newEcho()
	e.Use(middleware.Recover(), idemecho.New(options(cfg)))
	e.Any("/*", echo.WrapHandler(app))
	return serve(t, e)
}

// serve runs e.Start on a loopback listener until t ends.
func serve(t *testing.T, e *echo.Echo) string {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	e.Listener = lis
	done := make(chan error, 1)
	go func() { done <- e.Start("") }()
	t.Cleanup(func() {
		_ = e.Close()
		if err := <-done; !errors.Is(err, http.ErrServerClosed) {
			t.Errorf("echo Start = %v; want ErrServerClosed", err)
		}
	})
	return "http://" + lis.Addr().String()
}

// startKeyOptional is start with KeyOptional, telling unprotected about
// each "unprotected" event.
func startKeyOptional(t *testing.T, unprotected func(), app http.Handler) string {
	o := options(config{Store: &memstore.Store{}})
	o.KeyOptional = true
	o.OnEvent = func(_ echo.Context, ev string) {
		if ev == "unprotected" {
			unprotected()
		}
	}
	e := newEcho()
	e.Use(idemecho.New(o))
	e.Any("/*", echo.WrapHandler(app))
	return serve(t, e)
}
