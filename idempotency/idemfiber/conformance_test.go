package idemfiber_test

import (
	"net"
	"net/http"
	"strings"
	"testing"

	"github.com/gofiber/fiber/v2"
	"github.com/gofiber/fiber/v2/middleware/adaptor"
	"github.com/gofiber/fiber/v2/middleware/recover"

	"github.com/onceguard/onceguard/idempotency"
	"github.com/onceguard/onceguard/idempotency/adaptertest"
	"github.com/onceguard/onceguard/idempotency/idemfiber"
	"github.com/onceguard/onceguard/idempotency/idemstore"
	"github.com/onceguard/onceguard/idempotency/memstore"
	"github.com/onceguard/onceguard/idempotency/redisstore"
	"github.com/onceguard/onceguard/internal/redistest"
)

// startConformance is the suite's Start: a fiber server on a loopback
// port, fiber's recover middleware, the adapter, and the suite's net/http
// app behind fiber's own net/http adaptor for every method and path.
func startConformance(t *testing.T, cfg adaptertest.Config, app http.Handler) string {
	f := fiber.New(fiber.Config{DisableStartupMessage: true})
	f.Use(recover.New())
	f.Use(idemfiber.New(idempotency.Options[*fiber.Ctx]{
		Store: cfg.Store, Tokens: cfg.Tokens, Purpose: cfg.Purpose, Window: cfg.Window, Lease: cfg.Lease,
		// c.Get's string is fasthttp's buffer: a hook copies what it returns.
		Principal: func(c *fiber.Ctx) (string, error) { return strings.Clone(c.Get("X-User")), nil },
	}))
	f.Use(adaptor.HTTPHandler(app))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { defer close(done); _ = f.Listener(ln) }()
	t.Cleanup(func() { _ = f.Shutdown(); <-done })
	return "http://" + ln.Addr().String()
}

func TestConformance(t *testing.T) {
	adaptertest.Run(t, startConformance, func(*testing.T) idemstore.FullStore { return &memstore.Store{} })
}

func TestConformanceRedis(t *testing.T) {
	rdb := redistest.Shared(t)
	prefix := redistest.Prefix(t, rdb, "idemfiber") // its keys are deleted when the test ends
	adaptertest.Run(t, startConformance, func(*testing.T) idemstore.FullStore {
		return redisstore.New(rdb, &redisstore.Options{Prefix: prefix})
	})
}
