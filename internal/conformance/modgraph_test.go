package conformance_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// frameworks names each adapter module's framework. grpc-go is left out
// of the check: go-zero and kratos depend on it themselves.
var frameworks = map[string]string{
	"idemgin":    "github.com/gin-gonic/gin",
	"idemecho":   "github.com/labstack/echo/v4",
	"idemzero":   "github.com/zeromicro/go-zero",
	"idemkratos": "github.com/go-kratos/kratos/v2",
	"idemfiber":  "github.com/gofiber/fiber/v2",
	"idemhertz":  "github.com/cloudwego/hertz",
	"idemgrpc":   "", // none of the HTTP frameworks
}

// A user of one adapter downloads its framework and no other: each
// adapter module's own graph (go mod graph, outside the workspace) holds
// its framework and none of the others'.
func TestAdapterModulesTakeOneFramework(t *testing.T) {
	if testing.Short() {
		t.Skip("runs go mod graph in each adapter module")
	}
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command on PATH")
	}
	for dir, own := range frameworks {
		t.Run(dir, func(t *testing.T) {
			path := filepath.Join("..", "..", "idempotency", dir)
			if _, err := os.Stat(filepath.Join(path, "go.mod")); err != nil {
				t.Skipf("no module at %s", path)
			}
			cmd := exec.Command(goBin, "mod", "graph")
			cmd.Dir = path
			cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=mod")
			out, err := cmd.Output()
			if err != nil {
				t.Fatalf("go mod graph in %s: %v", path, err)
			}
			var mods []string
			for _, line := range strings.Split(string(out), "\n") {
				if _, dep, ok := strings.Cut(line, " "); ok {
					mod, _, _ := strings.Cut(dep, "@")
					mods = append(mods, mod)
				}
			}
			if own != "" && !slices.Contains(mods, own) {
				t.Errorf("%s's graph has no %s", dir, own)
			}
			for other, fw := range frameworks {
				if other != dir && fw != "" && fw != own && slices.Contains(mods, fw) {
					t.Errorf("%s's graph takes %s, %s's framework", dir, fw, other)
				}
			}
		})
	}
}

// The drivers and clients a user of natsjs or pgnotify did not ask for:
// natsjs takes NATS and no SQL driver (its SQL tests live in
// internal/integration), pgnotify takes pgx and no other driver, and
// neither takes a web framework.
func TestEventModulesTakeOnlyTheirClient(t *testing.T) {
	if testing.Short() {
		t.Skip("runs go mod graph")
	}
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command on PATH")
	}
	drivers := []string{"github.com/jackc/pgx/v5", "modernc.org/sqlite", "github.com/go-sql-driver/mysql", "github.com/nats-io/nats.go"}
	for _, m := range []struct{ dir, own string }{
		{filepath.Join("..", "..", "natsjs"), "github.com/nats-io/nats.go"},
		{filepath.Join("..", "..", "idempotency", "pgnotify"), "github.com/jackc/pgx/v5"},
	} {
		t.Run(filepath.Base(m.dir), func(t *testing.T) {
			cmd := exec.Command(goBin, "mod", "graph")
			cmd.Dir = m.dir
			cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=mod")
			out, err := cmd.Output()
			if err != nil {
				t.Fatalf("go mod graph in %s: %v", m.dir, err)
			}
			var mods []string
			for _, line := range strings.Split(string(out), "\n") {
				if _, dep, ok := strings.Cut(line, " "); ok {
					mod, _, _ := strings.Cut(dep, "@")
					mods = append(mods, mod)
				}
			}
			if !slices.Contains(mods, m.own) {
				t.Errorf("%s's graph has no %s", m.dir, m.own)
			}
			for _, d := range drivers {
				if d != m.own && slices.Contains(mods, d) {
					t.Errorf("%s's graph takes %s", m.dir, d)
				}
			}
			for _, fw := range frameworks {
				if fw != "" && slices.Contains(mods, fw) {
					t.Errorf("%s's graph takes %s", m.dir, fw)
				}
			}
		})
	}
}
