package idemgin_test

import (
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/onceguard/onceguard/idempotency"
	"github.com/onceguard/onceguard/idempotency/adaptertest"
	"github.com/onceguard/onceguard/idempotency/idemgin"
	"github.com/onceguard/onceguard/idempotency/memstore"
)

// config is what the conformance suite asks of the adapter.
type config = adaptertest.Config

func options(cfg config) idempotency.Options[*gin.Context] {
	return idempotency.Options[*gin.Context]{
		Store: cfg.Store, Tokens: cfg.Tokens, Purpose: cfg.Purpose, Window: cfg.Window, Lease: cfg.Lease,
		Principal: func(c *gin.Context) (string, error) { return c.GetHeader("X-User"), nil },
	}
}

// start serves app behind the guard on a real gin server, for every
// method and path, with gin's Recovery in front as a service has it.
func start(t *testing.T, cfg config, app http.Handler) string {
	gin.SetMode(gin.ReleaseMode)
	r := gin.New()
	r.Use(gin.RecoveryWithWriter(io.Discard), idemgin.New(options(cfg)))
	r.Any("/*path", gin.WrapH(app))
	return serve(t, r)
}

// serve serves h on a loopback port until t ends.
func serve(t *testing.T, h http.Handler) string {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(func() { _ = srv.Close() })
	return "http://" + lis.Addr().String()
}

// startKeyOptional is start with KeyOptional, telling unprotected about
// each "unprotected" event.
func startKeyOptional(t *testing.T, unprotected func(), app http.Handler) string {
	o := options(config{Store: &memstore.Store{}})
	o.KeyOptional = true
	o.OnEvent = func(_ *gin.Context, ev string) {
		if ev == "unprotected" {
			unprotected()
		}
	}
	r := gin.New()
	r.Use(idemgin.New(o))
	r.Any("/*path", gin.WrapH(app))
	return serve(t, r)
}
