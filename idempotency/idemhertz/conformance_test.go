package idemhertz_test

import (
	"net/http"
	"testing"

	"github.com/cloudwego/hertz/pkg/app"
	"github.com/cloudwego/hertz/pkg/app/middlewares/server/recovery"
	"github.com/cloudwego/hertz/pkg/app/server"
	"github.com/cloudwego/hertz/pkg/common/adaptor"

	"github.com/onceguard/onceguard/idempotency"
	"github.com/onceguard/onceguard/idempotency/adaptertest"
	"github.com/onceguard/onceguard/idempotency/idemhertz"
	"github.com/onceguard/onceguard/idempotency/idemstore"
	"github.com/onceguard/onceguard/idempotency/memstore"
	"github.com/onceguard/onceguard/idempotency/redisstore"
	"github.com/onceguard/onceguard/internal/redistest"
)

// startConformance is the suite's Start: a hertz server on a loopback
// port, hertz's recovery middleware, the adapter, and the suite's
// net/http app behind hertz's own net/http adaptor (which writes straight
// to the connection) for every method and path.
func startConformance(t *testing.T, cfg adaptertest.Config, handler http.Handler) string {
	return start(t, func(h *server.Hertz) {
		h.Use(recovery.Recovery())
		h.Use(idemhertz.New(idempotency.Options[*app.RequestContext]{
			Store: cfg.Store, Tokens: cfg.Tokens, Purpose: cfg.Purpose, Window: cfg.Window, Lease: cfg.Lease,
			Principal: func(c *app.RequestContext) (string, error) { return string(c.GetHeader("X-User")), nil },
		}))
		h.Any("/*path", adaptor.HertzHandler(handler))
	})
}

func TestConformance(t *testing.T) {
	adaptertest.Run(t, startConformance, func(*testing.T) idemstore.FullStore { return &memstore.Store{} })
}

func TestConformanceRedis(t *testing.T) {
	rdb := redistest.Shared(t)
	prefix := redistest.Prefix(t, rdb, "idemhertz") // its keys are deleted when the test ends
	adaptertest.Run(t, startConformance, func(*testing.T) idemstore.FullStore {
		return redisstore.New(rdb, &redisstore.Options{Prefix: prefix})
	})
}
