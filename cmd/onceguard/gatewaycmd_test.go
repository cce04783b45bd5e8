package main

import (
	"bytes"
	"context"
	"io"
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
	stdout := &syncBuffer{}
	errc := make(chan error, 1)
	go func() {
		errc <- run(ctx, []string{"gateway", "--addr", "127.0.0.1:0", "--upstream", up.URL, "--data-dir", t.TempDir(),
			"--route", "POST /pay", "--route", "POST /slow", "--principal-header", "X-User-Id"}, func(string) string { return "" }, stdout, io.Discard)
	}()
	var base string
	for deadline := time.Now().Add(10 * time.Second); base == ""; {
		if i := strings.Index(stdout.String(), "listening on http://"); i >= 0 {
			base = strings.TrimSuffix(strings.Fields(stdout.String()[i+len("listening on "):])[0], ";")
		}
		if time.Now().After(deadline) {
			t.Fatalf("no listening line: %q", stdout.String())
		}
		time.Sleep(5 * time.Millisecond)
	}
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
