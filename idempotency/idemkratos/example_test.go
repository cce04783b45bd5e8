package idemkratos_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"

	khttp "github.com/go-kratos/kratos/v2/transport/http"

	"github.com/onceguard/onceguard/idempotency"
	"github.com/onceguard/onceguard/idempotency/idemkratos"
	"github.com/onceguard/onceguard/idempotency/memstore"
)

// A retry with the same key gets the first answer, byte for byte, and the
// route runs once.
func Example() {
	srv := khttp.NewServer(khttp.Filter(idemkratos.Filter(idempotency.Config{
		Store:     &memstore.Store{},
		Principal: func(r *http.Request) (string, error) { return r.Header.Get("X-User"), nil }, // keys are per user
	})))
	runs := 0
	srv.Route("/").POST("/payments", func(ctx khttp.Context) error {
		runs++
		call, _ := idempotency.FromContext(ctx)
		return ctx.JSON(http.StatusCreated, map[string]any{"payment_id": fmt.Sprint("p", runs), "recovered": call.Recovered})
	})

	for range 2 {
		req := httptest.NewRequest(http.MethodPost, "/payments", strings.NewReader(`{"amount":"10.00"}`))
		req.Header.Set("Idempotency-Key", "8e03978e-40d5-43e8-bc93-6894a57f9324")
		req.Header.Set("X-User", "alice")
		w := httptest.NewRecorder()
		srv.ServeHTTP(w, req)                                                                                      // srv.Start(ctx) serves its listener instead
		fmt.Println(w.Code, strings.TrimSpace(w.Body.String()), "replayed="+w.Header().Get("Idempotent-Replayed")) // ctx.JSON ends with a newline
	}
	fmt.Println("route runs:", runs)
	// Output:
	// 201 {"payment_id":"p1","recovered":false} replayed=
	// 201 {"payment_id":"p1","recovered":false} replayed=true
	// route runs: 1
}
