package idemzero_test

import (
	"testing"

	"github.com/zeromicro/go-zero/core/conf"
	"github.com/zeromicro/go-zero/core/logx"
	"github.com/zeromicro/go-zero/rest"

	"github.com/onceguard/onceguard/idempotency"
	"github.com/onceguard/onceguard/idempotency/idemzero"
)

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
