package idemgin_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/gin-gonic/gin"

	"github.com/onceguard/onceguard/idempotency"
	"github.com/onceguard/onceguard/idempotency/idemgin"
	"github.com/onceguard/onceguard/idempotency/memstore"
)

// A retry with the same key gets the first answer, byte for byte, and the
// handler runs once.
func Example() {
	gin.SetMode(gin.ReleaseMode)
	runs := 0
	r := gin.New()
	r.Use(gin.Recovery()) // before the guard: a panic frees the key, then Recovery answers 500
	guard := idemgin.New(idempotency.Options[*gin.Context]{
		Store:     &memstore.Store{},
		Principal: func(c *gin.Context) (string, error) { return c.GetHeader("X-User"), nil }, // keys are per user
	})
	r.POST("/payments", guard, func(c *gin.Context) {
		runs++
		call, _ := idempotency.FromContext(c.Request.Context())
		c.JSON(http.StatusCreated, gin.H{"payment_id": fmt.Sprint("p", runs), "recovered": call.Recovered})
	})

	for range 2 {
		req := httptest.NewRequest(http.MethodPost, "/payments", strings.NewReader(`{"amount":"10.00"}`))
		req.Header.Set("Idempotency-Key", "8e03978e-40d5-43e8-bc93-6894a57f9324")
		req.Header.Set("X-User", "alice")
		w := httptest.NewRecorder()
		r.ServeHTTP(w, req)
		fmt.Println(w.Code, w.Body.String(), "replayed="+w.Header().Get("Idempotent-Replayed"))
	}
	fmt.Println("handler runs:", runs)
	// Output:
	// 201 {"payment_id":"p1","recovered":false} replayed=
	// 201 {"payment_id":"p1","recovered":false} replayed=true
	// handler runs: 1
}
