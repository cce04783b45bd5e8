package idemhertz_test

import (
	"context"
	"fmt"
	"strings"

	"github.com/cloudwego/hertz/pkg/app"
	"github.com/cloudwego/hertz/pkg/app/server"
	"github.com/cloudwego/hertz/pkg/common/ut"

	"github.com/onceguard/onceguard/idempotency"
	"github.com/onceguard/onceguard/idempotency/idemhertz"
	"github.com/onceguard/onceguard/idempotency/memstore"
)

// A retry with the same key gets the first answer, byte for byte, and the
// handler runs once.
func ExampleNew() {
	h := server.New()
	h.Use(idemhertz.New(idempotency.Options[*app.RequestContext]{Store: &memstore.Store{}}))
	runs := 0
	h.POST("/payments", func(ctx context.Context, c *app.RequestContext) {
		runs++
		c.Data(201, "application/json", fmt.Appendf(nil, `{"payment_id":"p%d"}`, runs))
	})

	for range 2 {
		body := `{"amount":"10.00"}`
		w := ut.PerformRequest(h.Engine, "POST", "/payments", &ut.Body{Body: strings.NewReader(body), Len: len(body)},
			ut.Header{Key: "Idempotency-Key", Value: "8e03978e-40d5-43e8-bc93-6894a57f9324"})
		resp := w.Result()
		fmt.Println(resp.StatusCode(), string(resp.Body()), "replayed="+string(resp.Header.Peek("Idempotent-Replayed")))
	}
	fmt.Println("handler runs:", runs)
	// Output:
	// 201 {"payment_id":"p1"} replayed=
	// 201 {"payment_id":"p1"} replayed=true
	// handler runs: 1
}
