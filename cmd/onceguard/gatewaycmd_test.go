package main

import (
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// Routes come from ONCEGUARD_GATEWAY_ROUTES (';'-separated), replaced as
// a whole by --route; a malformed one in the variable is an error naming it.
func TestGatewayRoutesFromEnv(t *testing.T) {
	env := &envVars{getenv: func(n string) string {
		return map[string]string{"ONCEGUARD_GATEWAY_ROUTES": "POST /withdraw withdrawal; POST /orders/{id}/pay payment"}[n]
	}}
	fs, c := gatewayFlags(env, io.Discard)
	if err := fs.Parse(nil); err != nil || env.err(fs) != nil {
		t.Fatal(err, env.err(fs))
	}
	if got := c.routes.String(); got != "POST /withdraw withdrawal; POST /orders/{id}/pay payment" {
		t.Errorf("routes from the environment = %q", got)
	}
	fs, c = gatewayFlags(env, io.Discard)
	if err := fs.Parse([]string{"--route", "PUT /a", "--route", "POST /b/{x}"}); err != nil {
		t.Fatal(err)
	}
	if got := c.routes.String(); got != "PUT /a; POST /b/{x}" {
		t.Errorf("routes with --route = %q; want only the flags'", got)
	}
	bad := &envVars{getenv: func(n string) string { return map[string]string{"ONCEGUARD_GATEWAY_ROUTES": "POST"}[n] }}
	fs, _ = gatewayFlags(bad, io.Discard)
	if err := fs.Parse(nil); err != nil {
		t.Fatal(err)
	}
	if err := bad.err(fs); err == nil || !strings.Contains(err.Error(), "ONCEGUARD_GATEWAY_ROUTES") {
		t.Errorf("a malformed route in the variable = %v; want an error naming it", err)
	}
	fs, _ = gatewayFlags(env, io.Discard)
	if err := fs.Parse([]string{"--route", "POST nopath"}); err == nil {
		t.Error("--route \"POST nopath\" parsed; want an error")
	}
}

func TestGatewayRefusesBadConfig(t *testing.T) {
	none := func(string) string { return "" }
	for name, args := range map[string][]string{
		"no upstream":        {"--principal-header", "X-User"},
		"no principal":       {"--upstream", "http://127.0.0.1:1"},
		"two principals":     {"--upstream", "http://127.0.0.1:1", "--principal-header", "X", "--principal-cookie", "Y"},
		"lease too short":    {"--upstream", "http://127.0.0.1:1", "--principal-header", "X", "--upstream-timeout", "10s", "--key-lease", "10s"},
		"token for no route": {"--upstream", "http://127.0.0.1:1", "--principal-header", "X", "--require-submit-token", "withdrawal", "--data-dir", t.TempDir()},
	} {
		if err := run(context.Background(), append([]string{"gateway", "--addr", "127.0.0.1:0"}, args...), none, io.Discard, io.Discard); err == nil {
			t.Errorf("%s: gateway started; want an error", name)
		}
	}
}

// The gateway in process on its default SQLite database: a guarded
// request forwarded once and replayed; SIGTERM (ctx) waits for the
// request in flight, then returns.
func TestGatewayRunSQLite(t *testing.T) {
	var calls atomic.Int32
	release := make(chan struct{})
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		if r.URL.Path == "/slow" {
			<-release
		}
		w.WriteHeader(201)
		_, _ = io.WriteString(w, "done")
	}))
	defer up.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	base, errc := startGatewayInProc(ctx, t, "--upstream", up.URL, "--route", "POST /pay", "--route", "POST /slow")
	post := func(path, key string) (*http.Response, string) {
		req, _ := http.NewRequest("POST", base+path, bytes.NewReader([]byte(`{"a":1}`)))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("X-User-Id", "u1")
		req.Header.Set("Idempotency-Key", key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp, string(b)
	}
	if resp, body := post("/pay", "k"); resp.StatusCode != 201 || body != "done" {
		t.Fatalf("first = %d %q", resp.StatusCode, body)
	}
	if resp, _ := post("/pay", "k"); resp.Header.Get("Idempotent-Replayed") != "true" || calls.Load() != 1 {
		t.Fatalf("retry = %v, upstream calls %d; want a replay and 1", resp.Header, calls.Load())
	}
	slow := make(chan int, 1)
	go func() { resp, _ := post("/slow", "s"); slow <- resp.StatusCode }()
	for calls.Load() < 2 {
		time.Sleep(5 * time.Millisecond)
	}
	cancel() // SIGTERM
	time.Sleep(50 * time.Millisecond)
	close(release)
	if st := <-slow; st != 201 {
		t.Errorf("the request in flight at SIGTERM = %d; want its answer, 201", st)
	}
	if err := <-errc; err != nil {
		t.Errorf("run = %v; want nil after a clean shutdown", err)
	}
}

// startGatewayInProc runs `onceguard gateway` in process on SQLite in a
// temporary directory, its principal in X-User-Id, until ctx ends; it
// returns its URL and where run's error goes.
func startGatewayInProc(ctx context.Context, t *testing.T, args ...string) (base string, errc chan error) {
	t.Helper()
	stdout := &syncBuffer{}
	errc = make(chan error, 1)
	args = append([]string{"gateway", "--addr", "127.0.0.1:0", "--data-dir", t.TempDir(), "--principal-header", "X-User-Id"}, args...)
	go func() { errc <- run(ctx, args, func(string) string { return "" }, stdout, io.Discard) }()
	return listenURL(t, "gateway", stdout, errc, 10*time.Second), errc
}

// With a short upstream timeout the gateway still stops cleanly though a
// client holds a connection it never sent a request on: its shutdown
// outlasts the 5 s net/http waits before it counts one idle.
func TestGatewayStopsWithASilentConnection(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	base, errc := startGatewayInProc(ctx, t, "--upstream", "http://127.0.0.1:1", "--route", "POST /pay", "--upstream-timeout", "100ms", "--key-lease", "1s")
	conn, err := net.Dial("tcp", strings.TrimPrefix(base, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	time.Sleep(50 * time.Millisecond) // the server has it: a new connection
	cancel()
	if err := <-errc; err != nil {
		t.Errorf("run = %v; want nil after a clean shutdown", err)
	}
}
