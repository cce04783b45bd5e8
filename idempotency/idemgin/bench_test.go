package idemgin_test

import (
	"net/http"
	"testing"

	"github.com/gin-gonic/gin"

	"github.com/onceguard/onceguard/idempotency"
	"github.com/onceguard/onceguard/idempotency/adaptertest"
	"github.com/onceguard/onceguard/idempotency/idemgin"
	"github.com/onceguard/onceguard/idempotency/memstore"
)

// The engine's ServeHTTP, with the handler alone or behind the guard on
// the memory store.
func benchEngine(guarded bool) *gin.Engine {
	gin.SetMode(gin.ReleaseMode)
	r := gin.New()
	h := []gin.HandlerFunc{func(c *gin.Context) { c.Data(http.StatusCreated, "application/json", benchBody) }}
	if guarded {
		h = append([]gin.HandlerFunc{idemgin.New(idempotency.Options[*gin.Context]{Store: &memstore.Store{}})}, h...)
	}
	r.POST("/withdrawals", h...)
	return r
}

func BenchmarkBare(b *testing.B)     { adaptertest.Benchmark(b, benchEngine(false), false) }
func BenchmarkFirstUse(b *testing.B) { adaptertest.Benchmark(b, benchEngine(true), false) }
func BenchmarkReplay(b *testing.B)   { adaptertest.Benchmark(b, benchEngine(true), true) }

// The harness is adaptertest.Benchmark, as for idempotency's
// BenchmarkMiddleware*: one reused request whose body and
// Idempotency-Key are reset before each call, one reused response writer
// whose header map is emptied, the keys made before the timer starts; so
// the harness allocates nothing per request, and the difference between
// BenchmarkFirstUse or BenchmarkReplay and BenchmarkBare is the guard's
// alone, next to idempotency's BenchmarkMiddleware* minus
// BenchmarkBaseline for net/http.

var benchBody = []byte(`{"id":"1"}`)
