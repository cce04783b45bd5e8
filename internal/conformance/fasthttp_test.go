package conformance_test

import (
	"context"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/cloudwego/hertz/pkg/app"
	"github.com/cloudwego/hertz/pkg/app/middlewares/server/recovery"
	"github.com/cloudwego/hertz/pkg/app/server"
	hertzadaptor "github.com/cloudwego/hertz/pkg/common/adaptor"
	"github.com/cloudwego/hertz/pkg/common/hlog"
	"github.com/gofiber/fiber/v2"
	fiberadaptor "github.com/gofiber/fiber/v2/middleware/adaptor"
	fiberrecover "github.com/gofiber/fiber/v2/middleware/recover"

	"github.com/onceguard/onceguard/idempotency"
	"github.com/onceguard/onceguard/idempotency/adaptertest"
	"github.com/onceguard/onceguard/idempotency/idemfiber"
	"github.com/onceguard/onceguard/idempotency/idemhertz"
)

// The adapters on HTTP stacks that are not net/http. Their own modules
// run the suite on memory and Redis; here it runs on every store.
func init() {
	hlog.SetLevel(hlog.LevelWarn) // no start and shutdown lines for every server
	adapters = append(adapters,
		struct {
			name  string
			start adaptertest.Start
		}{"fiber", startFiber},
		struct {
			name  string
			start adaptertest.Start
		}{"hertz", startHertz},
	)
}

func listen(t *testing.T) net.Listener {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return ln
}

// startFiber: fiber's recover, the adapter, the app behind fiber's
// net/http adaptor.
func startFiber(t *testing.T, cfg adaptertest.Config, app http.Handler) string {
	f := fiber.New(fiber.Config{DisableStartupMessage: true})
	f.Use(fiberrecover.New())
	f.Use(idemfiber.New(idempotency.Options[*fiber.Ctx]{
		Store: cfg.Store, Tokens: cfg.Tokens, Purpose: cfg.Purpose, Window: cfg.Window, Lease: cfg.Lease,
		Principal: func(c *fiber.Ctx) (string, error) { return strings.Clone(c.Get("X-User")), nil },
	}))
	f.Use(fiberadaptor.HTTPHandler(app))
	ln := listen(t)
	done := make(chan struct{})
	go func() { defer close(done); _ = f.Listener(ln) }()
	t.Cleanup(func() { _ = f.Shutdown(); <-done })
	return "http://" + ln.Addr().String()
}

// startHertz: hertz's recovery, the adapter, the app behind hertz's
// net/http adaptor.
func startHertz(t *testing.T, cfg adaptertest.Config, handler http.Handler) string {
	ln := listen(t)
	h := server.New(server.WithListener(ln), server.WithDisablePrintRoute(true), server.WithExitWaitTime(100*time.Millisecond))
	h.Use(recovery.Recovery())
	h.Use(idemhertz.New(idempotency.Options[*app.RequestContext]{
		Store: cfg.Store, Tokens: cfg.Tokens, Purpose: cfg.Purpose, Window: cfg.Window, Lease: cfg.Lease,
		Principal: func(c *app.RequestContext) (string, error) { return string(c.GetHeader("X-User")), nil },
	}))
	h.Any("/*path", hertzadaptor.HertzHandler(handler))
	done := make(chan struct{})
	go func() { defer close(done); _ = h.Run() }()
	t.Cleanup(func() { _ = h.Shutdown(context.Background()); <-done })
	return "http://" + ln.Addr().String()
}
