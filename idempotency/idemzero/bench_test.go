package idemzero_test

import (
	"net/http"
	"testing"

	"github.com/zeromicro/go-zero/rest"
	"github.com/zeromicro/go-zero/rest/chain"

	"github.com/onceguard/onceguard/idempotency"
	"github.com/onceguard/onceguard/idempotency/adaptertest"
	"github.com/onceguard/onceguard/idempotency/memstore"
)

// go-zero's router with the handler alone or behind the guard on the
// memory store; with go-zero's native chain (newServer's: Recover,
// Timeout, MaxBytes, MaxConns, Breaker, Gunzip), or none (the router and
// the middleware alone: the guard's own cost, less noise).
func benchServer(b *testing.B, guarded, native bool) http.Handler {
	var cfg *idempotency.Config
	if guarded {
		cfg = &idempotency.Config{Store: &memstore.Store{}}
	}
	var opts []rest.RunOption
	if !native {
		opts = append(opts, rest.WithChain(chain.New()))
	}
	server := newServer(b, cfg, opts...)
	server.AddRoute(rest.Route{Method: http.MethodPost, Path: "/withdrawals", Handler: func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write(benchBody)
	}})
	h, err := rest.NewServerless(server)
	if err != nil {
		b.Fatal(err)
	}
	return http.HandlerFunc(h.Serve)
}

func chains(b *testing.B, f func(b *testing.B, native bool)) {
	b.Run("chain=default", func(b *testing.B) { f(b, true) })
	b.Run("chain=none", func(b *testing.B) { f(b, false) })
}

func BenchmarkBare(b *testing.B) {
	chains(b, func(b *testing.B, native bool) { adaptertest.Benchmark(b, benchServer(b, false, native), false) })
}

func BenchmarkFirstUse(b *testing.B) {
	chains(b, func(b *testing.B, native bool) { adaptertest.Benchmark(b, benchServer(b, true, native), false) })
}

func BenchmarkReplay(b *testing.B) {
	chains(b, func(b *testing.B, native bool) { adaptertest.Benchmark(b, benchServer(b, true, native), true) })
}

// The harness is adaptertest.Benchmark, as for idempotency's
// BenchmarkMiddleware*: one reused request whose body and
// Idempotency-Key are reset before each call, one reused response writer
// whose header map is emptied, the keys made before the timer starts; so
// the harness allocates nothing per request, and the difference between
// BenchmarkFirstUse or BenchmarkReplay and BenchmarkBare is the guard's
// alone, next to idempotency's BenchmarkMiddleware* minus
// BenchmarkBaseline for net/http.

var benchBody = []byte(`{"id":"1"}`)
