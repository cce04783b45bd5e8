package idemecho_test

import (
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"

	"github.com/labstack/echo/v4"
)

func newEcho() *echo.Echo {
	e := echo.New()
	e.HideBanner, e.HidePort = true, true
	e.Logger.SetOutput(io.Discard)
	return e
}

// serve runs e.Start on a loopback listener until t ends.
func serve(t *testing.T, e *echo.Echo) string {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	e.Listener = lis
	done := make(chan error, 1)
	go func() { done <- e.Start("") }()
	t.Cleanup(func() {
		_ = e.Close()
		if err := <-done; !errors.Is(err, http.ErrServerClosed) {
			t.Errorf("echo Start = %v; want ErrServerClosed", err)
		}
	})
	return "http://" + lis.Addr().String()
}

// post sends body to url+"/payments" as alice, with key unless it is
// empty, and returns the answer and its body (nil and the error's text
// when the request failed).
func post(t *testing.T, url, key, body string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, url+"/payments", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-User", "alice")
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err.Error()
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, string(b)
}
