package idemecho_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/labstack/echo/v4"
	"github.com/labstack/echo/v4/middleware"

	"github.com/onceguard/onceguard/idempotency"
	"github.com/onceguard/onceguard/idempotency/idemecho"
	"github.com/onceguard/onceguard/idempotency/memstore"
)

// A retry with the same key gets the first answer, byte for byte, and the
// handler runs once.
func Example() {
	runs := 0
	e := echo.New()
	e.Use(middleware.Recover()) // before the guard: a panic frees the key, then Recover answers 500
	guard := idemecho.New(idempotency.Options[echo.Context]{
		Store:     &memstore.Store{},
		Principal: func(c echo.Context) (string, error) { return c.Request().Header.Get("X-User"), nil }, // keys are per user
	})
	e.POST("/payments", func(c echo.Context) error {
		runs++
		call, _ := idempotency.FromContext(c.Request().Context())
		return c.JSON(http.StatusCreated, map[string]any{"payment_id": fmt.Sprint("p", runs), "recovered": call.Recovered})
	}, guard)

	for range 2 {
		req := httptest.NewRequest(http.MethodPost, "/payments", strings.NewReader(`{"amount":"10.00"}`))
		req.Header.Set("Idempotency-Key", "8e03978e-40d5-43e8-bc93-6894a57f9324")
		req.Header.Set("X-User", "alice")
		w := httptest.NewRecorder()
		e.ServeHTTP(w, req)
		fmt.Println(w.Code, strings.TrimSpace(w.Body.String()), "replayed="+w.Header().Get("Idempotent-Replayed")) // c.JSON ends with a newline
	}
	fmt.Println("handler runs:", runs)
	// Output:
	// 201 {"payment_id":"p1","recovered":false} replayed=
	// 201 {"payment_id":"p1","recovered":false} replayed=true
	// handler runs: 1
}
