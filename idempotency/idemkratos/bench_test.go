package idemkratos_test

import (
	"net/http"
	"testing"

	khttp "github.com/go-kratos/kratos/v2/transport/http"

	"github.com/onceguard/onceguard/idempotency"
	"github.com/onceguard/onceguard/idempotency/adaptertest"
	"github.com/onceguard/onceguard/idempotency/idemkratos"
	"github.com/onceguard/onceguard/idempotency/memstore"
)

// The kratos server's ServeHTTP (its filters, router and transport
// context) with a route alone or behind the guard on the memory store.
func benchServer(guarded bool) http.Handler {
	var opts []khttp.ServerOption
	if guarded {
		opts = append(opts, khttp.Filter(idemkratos.Filter(idempotency.Config{Store: &memstore.Store{}})))
	}
	srv := khttp.NewServer(opts...)
	srv.Route("/").POST("/withdrawals", func(c khttp.Context) error {
		return c.Blob(http.StatusCreated, "application/json", benchBody)
	})
	return srv
}

func BenchmarkBare(b *testing.B)     { adaptertest.Benchmark(b, benchServer(false), false) }
func BenchmarkFirstUse(b *testing.B) { adaptertest.Benchmark(b, benchServer(true), false) }
func BenchmarkReplay(b *testing.B)   { adaptertest.Benchmark(b, benchServer(true), true) }

// The harness is adaptertest.Benchmark, as for idempotency's
// BenchmarkMiddleware*: one reused request whose body and
// Idempotency-Key are reset before each call, one reused response writer
// whose header map is emptied, the keys made before the timer starts; so
// the harness allocates nothing per request, and the difference between
// BenchmarkFirstUse or BenchmarkReplay and BenchmarkBare is the guard's
// alone, next to idempotency's BenchmarkMiddleware* minus
// BenchmarkBaseline for net/http.

var benchBody = []byte(`{"id":"1"}`)
