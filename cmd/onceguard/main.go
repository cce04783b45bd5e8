// Command onceguard runs the onceguard reference service and its tools.
//
//	onceguard [serve] [flags]   the service (the default command)
//	onceguard psp [--addr A]    the simulated payment provider over HTTP
//	onceguard version           print the version
//
// Every flag can also be set from the environment; see README.md.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/onceguard/onceguard/internal/psp"
)

const version = "0.1.0-dev"

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr); err != nil {
		if !errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(os.Stderr, "onceguard:", err)
		}
		os.Exit(2)
	}
}

// run is the whole program, with its environment passed in, so that tests
// can run it in process.
func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	cmd := "serve"
	if len(args) > 0 && len(args[0]) > 0 && args[0][0] != '-' {
		cmd, args = args[0], args[1:]
	}
	switch cmd {
	case "serve":
		return serve(ctx, args, getenv, stdout, stderr)
	case "psp":
		return servePSP(ctx, args, getenv, stdout, stderr)
	case "version":
		fmt.Fprintln(stdout, "onceguard", version)
		return nil
	default:
		return fmt.Errorf("unknown command %q (want serve, psp or version)", cmd)
	}
}

// serveConfig is the service's configuration (shared/api.md, "Process").
type serveConfig struct {
	addr, db, dataDir, redis, psp string
}

func serve(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.SetOutput(stderr)
	env := func(name, def string) string { return envOr(getenv, name, def) }
	var c serveConfig
	fs.StringVar(&c.addr, "addr", env("ONCEGUARD_ADDR", "127.0.0.1:8080"), "listen address [ONCEGUARD_ADDR]")
	fs.StringVar(&c.db, "db", env("ONCEGUARD_DB", ""), "database URL: sqlite:///path, postgres://..., mysql://... (default: SQLite under --data-dir) [ONCEGUARD_DB]")
	fs.StringVar(&c.dataDir, "data-dir", env("ONCEGUARD_DATA_DIR", "./data"), "data directory [ONCEGUARD_DATA_DIR]")
	fs.StringVar(&c.redis, "redis", env("ONCEGUARD_REDIS", ""), "Redis URL, or several comma-separated for independent nodes [ONCEGUARD_REDIS]")
	fs.StringVar(&c.psp, "psp", env("ONCEGUARD_PSP", ""), "external payment provider URL (default: simulated in process) [ONCEGUARD_PSP]")
	if err := fs.Parse(args); err != nil {
		return err
	}
	_ = ctx
	// The HTTP service (accounts, deposits, withdrawals, orders, payments)
	// is not built yet; say so plainly rather than pretend.
	fmt.Fprintf(stdout, "onceguard %s: the reference service is not built yet.\n", version)
	fmt.Fprintf(stdout, "It will listen on %s with database %s and locks on %s.\n", c.addr, describeDB(c), describeRedis(c))
	fmt.Fprintln(stdout, "Available today: the lock, token and idempotency libraries, and `onceguard psp` (the simulated payment provider); see README.md.")
	return nil
}

func describeDB(c serveConfig) string {
	if c.db == "" {
		return "sqlite (" + c.dataDir + "/onceguard.db)"
	}
	return c.db
}

func describeRedis(c serveConfig) string {
	if c.redis == "" {
		return "the database and in-process stores"
	}
	return "Redis " + c.redis + " (database fallback)"
}

// servePSP runs the simulated payment provider over HTTP until ctx ends.
func servePSP(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("psp", flag.ContinueOnError)
	fs.SetOutput(stderr)
	addr := fs.String("addr", envOr(getenv, "ONCEGUARD_PSP_ADDR", "127.0.0.1:8090"), "listen address [ONCEGUARD_PSP_ADDR]")
	if err := fs.Parse(args); err != nil {
		return err
	}
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: psp.Handler(&psp.Sim{}), ReadHeaderTimeout: 5 * time.Second}
	fmt.Fprintf(stdout, "onceguard psp: simulated payment provider on http://%s\n", ln.Addr())
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return srv.Shutdown(sctx)
}

func envOr(getenv func(string) string, name, def string) string {
	if v := getenv(name); v != "" {
		return v
	}
	return def
}
