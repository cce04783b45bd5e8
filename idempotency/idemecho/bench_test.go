package idemecho_test

import (
	"net/http"
	"testing"

	"github.com/labstack/echo/v4"

	"github.com/onceguard/onceguard/idempotency"
	"github.com/onceguard/onceguard/idempotency/adaptertest"
	"github.com/onceguard/onceguard/idempotency/idemecho"
	"github.com/onceguard/onceguard/idempotency/memstore"
)

// Echo's ServeHTTP, with the handler alone or behind the guard on the
// memory store.
func benchEcho(guarded bool) *echo.Echo {
	e := newEcho()
	var m []echo.MiddlewareFunc
	if guarded {
		m = append(m, idemecho.New(idempotency.Options[echo.Context]{Store: &memstore.Store{}}))
	}
	e.POST("/withdrawals", func(c echo.Context) error { return c.Blob(http.StatusCreated, "application/json", benchBody) }, m...)
	return e
}

func BenchmarkBare(b *testing.B)     { adaptertest.Benchmark(b, benchEcho(false), false) }
func BenchmarkFirstUse(b *testing.B) { adaptertest.Benchmark(b, benchEcho(true), false) }
func BenchmarkReplay(b *testing.B)   { adaptertest.Benchmark(b, benchEcho(true), true) }

// The harness is adaptertest.Benchmark, as for idempotency's
// BenchmarkMiddleware*: one reused request whose body and
// Idempotency-Key are reset before each call, one reused response writer
// whose header map is emptied, the keys made before the timer starts; so
// the harness allocates nothing per request, and the difference between
// BenchmarkFirstUse or BenchmarkReplay and BenchmarkBare is the guard's
// alone, next to idempotency's BenchmarkMiddleware* minus
// BenchmarkBaseline for net/http.

var benchBody = []byte(`{"id":"1"}`)
