package idemecho_test

import (
	"errors"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/labstack/echo/v4"

	"github.com/onceguard/onceguard/idempotency/idemecho"
	"github.com/onceguard/onceguard/idempotency/memstore"
)

// An error a handler returns is answered by Echo's HTTPErrorHandler
// inside the guard: a 4xx is stored and replayed, a 5xx frees the key.
func TestEchoErrors(t *testing.T) {
	var runs atomic.Int32
	e := newEcho()
	e.Use(idemecho.New(options(config{Store: &memstore.Store{}})))
	e.POST("/payments", func(c echo.Context) error {
		n := runs.Add(1)
		switch c.Request().Header.Get("Idempotency-Key") {
		case "refused":
			return echo.NewHTTPError(http.StatusPaymentRequired, "insufficient funds")
		case "broken":
			if n == 2 {
				return errors.New("database down") // 500
			}
		}
		return c.NoContent(http.StatusCreated)
	})
	url := serve(t, e)

	first, b1 := post(t, url, "refused", `{}`)
	if first == nil || first.StatusCode != http.StatusPaymentRequired || !strings.Contains(b1, "insufficient funds") {
		t.Fatalf("refusal = %v %s; want 402 with the error's message", first, b1)
	}
	again, b2 := post(t, url, "refused", `{}`)
	if again == nil || again.StatusCode != http.StatusPaymentRequired || b2 != b1 || again.Header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("retry of the refusal = %v %s; want it replayed", again, b2)
	}
	if resp, body := post(t, url, "broken", `{}`); resp == nil || resp.StatusCode != http.StatusInternalServerError {
		t.Fatalf("error = %v %s; want 500", resp, body)
	}
	if resp, body := post(t, url, "broken", `{}`); resp == nil || resp.StatusCode != http.StatusCreated || resp.Header.Get("Idempotent-Replayed") != "" {
		t.Fatalf("retry after the 500 = %v %s; want a first 201", resp, body)
	}
	if n := runs.Load(); n != 3 {
		t.Errorf("handler ran %d times; want 3", n)
	}
}
