package idemkratos_test

import (
	"context"
	"net"
	"net/http"
	"testing"
	"time"

	khttp "github.com/go-kratos/kratos/v2/transport/http"

	"github.com/onceguard/onceguard/idempotency"
	"github.com/onceguard/onceguard/idempotency/idemkratos"
	"github.com/onceguard/onceguard/idempotency/idemstore"
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

// start serves app behind the guard on a real kratos HTTP server (Start
// on a loopback listener), for every method and path (HandlePrefix "/").
// The route's timeout is kratos' 1s raised to 30s: a loaded test machine
// must not cut a handler short.
func start(t *testing.T, cfg config, app http.Handler) string {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := khttp.NewServer(khttp.Listener(lis), khttp.Timeout(30*time.Second), khttp.Filter(idemkratos.Filter(options(cfg))))
	srv.HandlePrefix("/", app)
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
