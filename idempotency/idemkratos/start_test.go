package idemkratos_test

import (
	"context"
	"io"
	"log"
	"net"
	"net/http"
	"testing"
	"time"

	khttp "github.com/go-kratos/kratos/v2/transport/http"

	"github.com/onceguard/onceguard/idempotency"
	"github.com/onceguard/onceguard/idempotency/adaptertest"
	"github.com/onceguard/onceguard/idempotency/idemkratos"
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

// start serves app behind the guard on a real kratos HTTP server (Start
// on a loopback listener), for every method and path (HandlePrefix "/").
// The route's timeout is kratos' 1s raised to 30s: a loaded test machine
// must not cut a handler short.
func start(t *testing.T, cfg config, app http.Handler) string {
	return startConfig(t, options(cfg), app)
}

func startConfig(t *testing.T, o idempotency.Config, app http.Handler) string {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := khttp.NewServer(khttp.Listener(lis), khttp.Timeout(30*time.Second), khttp.Filter(idemkratos.Filter(o)))
	srv.HandlePrefix("/", app)
	srv.ErrorLog = log.New(io.Discard, "", 0) // the suite's panicking handler: net/http logs its stack
	done := make(chan error, 1)
	go func() { done <- srv.Start(context.Background()) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Stop(ctx)
		if err := <-done; err != nil {
			t.Errorf("kratos Start = %v; want nil after Stop", err)
		}
	})
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
	return startConfig(t, o, app)
}
